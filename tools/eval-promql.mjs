// Evaluates every PromQL expression of the Grafana dashboards and the Prometheus rules (as
// extracted by tools/list-promql.mjs) against a running Prometheus that scrapes orion-server and
// loads the rules, and fails unless each one returns data. tools/check-promql.sh sets up the
// server, the workload and Prometheus and runs this; the checks are documented there.
//
// Usage: node tools/eval-promql.mjs --prometheus=URL --rules=FILE [--rules-name=NAME]
//          [--job=orion-server] [--rate-interval=10s] [--deadline-s=60]
//          [dashboard.json ...]
//   (dashboards default to deploy/dashboards/*.json)
// A result whose samples are all NaN (a histogram or ratio with nothing observed) fails.
// Checks still failing are retried once a second until the deadline (data appears as scrapes
// and rule evaluations come in); a query Prometheus rejects fails at once. Exit status 0 only if
// every check passed.
import { readFileSync } from "node:fs";
import { parse } from "yaml";
import { collectExpressions, defaultFiles, labelValuesLabel, splitComparison } from "./list-promql.mjs";

const opts = { job: "orion-server", rateInterval: "10s", deadlineS: 60, rulesName: null };
const dashboards = [];
for (const arg of process.argv.slice(2)) {
  const [key, ...rest] = arg.split("=");
  const value = rest.join("=");
  if (key === "--prometheus") opts.prometheus = value.replace(/\/$/, "");
  else if (key === "--rules") opts.rules = value;
  else if (key === "--rules-name") opts.rulesName = value;
  else if (key === "--job") opts.job = value;
  else if (key === "--rate-interval") opts.rateInterval = value;
  else if (key === "--deadline-s") opts.deadlineS = Number(value);
  else if (arg.startsWith("--")) throw new Error(`unknown option ${arg}`);
  else dashboards.push(arg);
}
if (!opts.prometheus || !opts.rules) {
  console.error("usage: eval-promql.mjs --prometheus=URL --rules=FILE [options] [dashboard.json ...]");
  process.exit(2);
}
if (dashboards.length === 0) dashboards.push(...defaultFiles().filter((f) => f.endsWith(".json")));
const rulesFile = { path: opts.rules, name: opts.rulesName ?? opts.rules };
const started = Date.now();
const deadline = started + opts.deadlineS * 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One instant query at "now". Returns { ok, permanent, answer, series, values } where answer is
// Prometheus' reply (for messages); permanent marks a query Prometheus rejected.
async function query(expr) {
  let res, body;
  try {
    res = await fetch(`${opts.prometheus}/api/v1/query`, {
      method: "POST", body: new URLSearchParams({ query: expr }),
    });
    body = await res.json();
  } catch (e) {
    return { ok: false, permanent: false, answer: `request failed: ${e.message}` };
  }
  if (body.status !== "success") {
    return { ok: false, permanent: body.errorType === "bad_data", answer: body };
  }
  const { resultType, result } = body.data;
  const series = resultType === "scalar" ? [{ metric: {}, value: result }] :
    resultType === "vector" ? result : [];
  // Data means at least one sample that is a number (histogram_quantile and ratios yield NaN
  // when nothing happened in the window).
  const values = series.map((s) => Number(s.value[1]));
  return { ok: values.some((v) => !Number.isNaN(v)), permanent: false, answer: body, series, values };
}

const escapeRegex = (s) => s.replace(/[\\^$.*+?()[\]{}|]/g, "\\$&");
const brief = (answer) => {
  const text = typeof answer === "string" ? answer : JSON.stringify(answer);
  return text.length > 600 ? `${text.slice(0, 600)}...` : text;
};

// A check: { source, what, expr, run() -> { ok, permanent, answer, note } }.
function exprCheck(source, what, expr) {
  return {
    source, what, expr,
    async run() {
      const r = await query(expr);
      if (r.ok) {
        const v = r.values.filter((x) => !Number.isNaN(x));
        const fmt = (x) => Number(x.toPrecision(3));
        r.note = `${r.series.length} series, ${v.length > 1 ? `${fmt(Math.min(...v))} .. ${fmt(Math.max(...v))}` : fmt(v[0])}`;
      } else if (!r.permanent && r.series) {
        r.answer = { note: r.series.length ? "only NaN samples" : "empty result", reply: r.answer };
      }
      return r;
    },
  };
}

async function runChecks(checks) {
  let pending = checks;
  const failed = [];
  for (;;) {
    const still = [];
    for (const c of pending) {
      const r = await c.run();
      c.last = r;
      if (r.ok) {
        console.log(`ok    ${c.source}  [${c.what}] ${r.note ?? ""}`);
      } else if (r.permanent) failed.push(c);
      else still.push(c);
    }
    pending = still;
    if (pending.length === 0 || Date.now() >= deadline) break;
    await sleep(1000);
  }
  return [...failed, ...pending];
}

function report(failures) {
  for (const c of failures) {
    console.log(`FAIL  ${c.source}  [${c.what}]`);
    if (c.expr) console.log(`      expr:   ${c.expr}`);
    console.log(`      answer: ${brief(c.last?.answer ?? "not run")}`);
  }
}

// 1. Prometheus scrapes the server, and the variables' queries list node and GPU values.
const phase1 = [exprCheck(`scrape job ${opts.job}`, "target up", `up{job="${opts.job}"} == 1`)];
const dashExprs = collectExpressions(dashboards, { rateInterval: opts.rateInterval });
const chosen = {};  // variable -> one concrete value
for (const v of dashExprs.filter((e) => e.kind === "variable")) {
  const label = labelValuesLabel(v.raw);
  phase1.push({
    source: v.source, what: `variable, label_values(..., ${label}) with "All"`, expr: v.expr,
    async run() {
      // The gpu variable's query uses $node: evaluate it with the node chosen so far.
      const expr = collectExpressions(dashboards, { rateInterval: opts.rateInterval, vars: chosen })
        .find((e) => e.source === v.source).expr;
      this.expr = expr;
      const r = await query(expr);
      if (!r.ok || !label) return { ...r, note: `${r.series?.length ?? 0} series` };
      const values = [...new Set(r.series.map((s) => s.metric[label]).filter(Boolean))].sort();
      if (values.length === 0) {
        return { ok: false, answer: { note: `no series has a ${label} label`, reply: r.answer } };
      }
      chosen[v.variable] = escapeRegex(values[0]);
      return { ok: true, note: `${label} values: ${values.join(", ")}` };
    },
  });
}
const failures = [];
// In order: nothing else can pass without the target; the gpu variable's query uses $node.
for (const c of phase1) {
  failures.push(...(await runChecks([c])));
  if (failures.length && c === phase1[0]) break;
}
const targetUp = !failures.includes(phase1[0]);

// 2. Every panel target with the variables at "All" and at one concrete value each; the
// recording rules' expressions and the series they record; the alert conditions' left operands
// (an alert's full expression is empty while healthy) and the full expressions (no error).
const checks = [];
const rules = collectExpressions([rulesFile]);
for (const e of dashExprs.filter((x) => x.kind === "panel")) {
  checks.push(exprCheck(e.source, "panel, variables All", e.expr));
}
if (targetUp && failures.length === 0) {
  const concrete = collectExpressions(dashboards, { rateInterval: opts.rateInterval, vars: chosen });
  const label = Object.entries(chosen).map(([k, v]) => `${k}=~"${v}"`).join(", ");
  for (const e of concrete.filter((x) => x.kind === "panel")) {
    checks.push(exprCheck(e.source, `panel, ${label}`, e.expr));
  }
}
for (const r of rules) {
  if (r.kind === "record") {
    checks.push(exprCheck(r.source, "recording rule expr", r.expr));
    checks.push(exprCheck(r.source, "recorded series", r.record));
  } else {
    const cmp = splitComparison(r.expr);
    if (cmp) {
      checks.push(exprCheck(r.source, `alert condition, left of "${cmp.op} ${cmp.right}"`, cmp.left));
      checks.push({
        source: r.source, what: "alert expr evaluates", expr: r.expr,
        async run() {
          const q = await query(r.expr);
          const ok = q.answer?.status === "success";
          return { ok, permanent: q.permanent, answer: q.answer,
                   note: `${q.series?.length ?? 0} series with the condition true now` };
        },
      });
    } else {
      checks.push(exprCheck(r.source, "alert expr", r.expr));
    }
  }
}
// Prometheus loaded every rule of the file and evaluates each without error.
const wanted = parse(readFileSync(rulesFile.path, "utf8")).groups
  .flatMap((g) => g.rules.map((r) => ({ group: g.name, name: r.record ?? r.alert })));
checks.push({
  source: rulesFile.name, what: `${wanted.length} rules loaded, health ok`, expr: null,
  async run() {
    let body;
    try {
      body = await (await fetch(`${opts.prometheus}/api/v1/rules`)).json();
    } catch (e) {
      return { ok: false, answer: `request failed: ${e.message}` };
    }
    const loaded = new Map();
    for (const g of body.data?.groups ?? []) for (const r of g.rules) loaded.set(`${g.name}/${r.name}`, r);
    const bad = wanted.map((w) => ({ ...w, r: loaded.get(`${w.group}/${w.name}`) }))
      .filter((w) => !w.r || w.r.health !== "ok")
      .map((w) => `${w.group}/${w.name}: ${w.r ? `health ${w.r.health} ${w.r.lastError ?? ""}` : "not loaded"}`);
    return { ok: bad.length === 0, answer: bad.join("; "), note: "" };
  },
});
if (targetUp) failures.push(...(await runChecks(checks)));

// Which alerts the workload set off (information only).
try {
  const alerts = (await (await fetch(`${opts.prometheus}/api/v1/alerts`)).json()).data.alerts;
  const active = [...new Set(alerts.map((a) => `${a.labels.alertname} (${a.state})`))];
  console.log(`alerts active now: ${active.length ? active.join(", ") : "none"}`);
} catch { /* informational */ }

const exprCount = dashExprs.length + rules.length;
const seconds = ((Date.now() - started) / 1000).toFixed(1);
if (failures.length) {
  report(failures);
  console.log(`${failures.length} check(s) failed (${exprCount} expressions, ${seconds} s)`);
  process.exit(1);
}
console.log(`all ${exprCount} expressions returned data (${phase1.length + checks.length} checks, ${seconds} s)`);
