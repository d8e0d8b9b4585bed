// Prints every PromQL expression of the Grafana dashboards and the Prometheus rules, one JSON
// object a line ({"source": ..., "kind": ..., "expr": ...}), with Grafana variables replaced so
// Prometheus can evaluate them: $node/$gpu -> ".*" (the variables' "All" value) or the value
// given with --var, $__rate_interval/$__interval -> the given interval (default 1m),
// label_values(X, l) -> X. Also a module: tools/eval-promql.mjs imports the extraction from here
// and evaluates every expression against a Prometheus scraping a real orion-server
// (tools/check-promql.sh, run by CI).
//
// Usage: node tools/list-promql.mjs [--rate-interval=1m] [--var=node=VALUE ...]
//                                   [dashboard.json|rules.yaml ...]
//   (defaults: deploy/dashboards/*.json and deploy/k8s/prometheus-rules.yaml)
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parse } from "yaml";

export const root = join(dirname(fileURLToPath(import.meta.url)), "..");

export function defaultFiles() {
  const dash = join(root, "deploy/dashboards");
  const files = readdirSync(dash).filter((f) => f.endsWith(".json")).map((f) => join(dash, f));
  files.push(join(root, "deploy/k8s/prometheus-rules.yaml"));
  return files;
}

// The Grafana variables the dashboards use in PromQL; each defaults to its "All" value.
export const DASHBOARD_VARIABLES = ["node", "gpu"];

// Grafana expression -> PromQL. vars maps a variable name to the regex it stands for (".*" when
// absent); label_values(X, label) becomes X, whose series carry the values of the variable.
export function grafanaToPromql(expr, { rateInterval = "1m", vars = {} } = {}) {
  const labelValues = /^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$/s.exec(expr.trim());
  if (labelValues) expr = labelValues[1];
  const names = DASHBOARD_VARIABLES.join("|");
  return expr
    .replaceAll("$__rate_interval", rateInterval)
    .replaceAll("$__interval", rateInterval)
    .replace(new RegExp(`\\$\\{?(${names})\\}?`, "g"), (_, name) => vars[name] ?? ".*");
}

// The label a label_values(X, label) variable query lists, or null.
export function labelValuesLabel(expr) {
  const m = /^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$/s.exec(expr.trim());
  return m ? m[2] : null;
}

// Every expression of the given dashboards (.json) and rule files (anything else: Prometheus
// rule-file YAML); a file is a path or { path, name } where name replaces the path in sources
// (default: the path relative to the repository). kind: panel | variable | record | alert. raw is the expression as written,
// expr the PromQL from grafanaToPromql (options as there); record is a recording rule's name,
// variable a dashboard variable's name.
export function collectExpressions(files, options = {}) {
  const out = [];
  for (const entry of files) {
    const file = entry.path ?? entry;
    const rel = relative(root, resolve(file));
    const name = entry.name ?? (rel.startsWith("..") ? file : rel);
    if (file.endsWith(".json")) {
      const dash = JSON.parse(readFileSync(file, "utf8"));
      const walk = (panels) => {
        for (const p of panels ?? []) {
          for (const t of p.targets ?? []) {
            if (!t.expr) continue;
            out.push({ source: `${name}#${p.title}/${t.refId}`, kind: "panel", raw: t.expr,
                       expr: grafanaToPromql(t.expr, options) });
          }
          walk(p.panels);
        }
      };
      walk(dash.panels);
      for (const v of dash.templating?.list ?? []) {
        const q = typeof v.query === "string" ? v.query : v.query?.query;
        if (v.type === "query" && q) {
          out.push({ source: `${name}#var:${v.name}`, kind: "variable", variable: v.name,
                     raw: q, expr: grafanaToPromql(q, options) });
        }
      }
    } else {
      const rules = parse(readFileSync(file, "utf8"));
      for (const g of rules.groups ?? []) {
        for (const r of g.rules ?? []) {
          out.push({ source: `${name}#${g.name}/${r.record ?? r.alert}`,
                     kind: r.record ? "record" : "alert", record: r.record, raw: r.expr,
                     expr: r.expr });
        }
      }
    }
  }
  return out;
}

// Splits an expression at its top-level comparison (==, !=, >, <, >=, <=; the last one, as
// comparisons associate to the left) and returns { left, op, right } with op including a
// "bool" modifier, or null when there is none or when a set operator (and, or, unless) sits at
// the top level. Parentheses, brackets, braces, strings and comments are skipped, so
// "sum(x > 0)" and label matchers such as {a!="b"} are not split.
export function splitComparison(expr) {
  let depth = 0;
  let last = null;
  for (let i = 0; i < expr.length; i++) {
    const c = expr[i];
    if (c === '"' || c === "'" || c === "`") {
      for (i++; i < expr.length && expr[i] !== c; i++) if (expr[i] === "\\" && c !== "`") i++;
      continue;
    }
    if (c === "#") {
      while (i < expr.length && expr[i] !== "\n") i++;
      continue;
    }
    if ("([{".includes(c)) depth++;
    else if (")]}".includes(c)) depth--;
    if (depth !== 0) continue;
    if (/[A-Za-z_:]/.test(c)) {
      const word = /^[A-Za-z_:][A-Za-z0-9_:]*/.exec(expr.slice(i))[0];
      if (["and", "or", "unless"].includes(word)) return null;
      i += word.length - 1;
      continue;
    }
    const two = expr.slice(i, i + 2);
    if (["==", "!=", ">=", "<="].includes(two)) {
      last = { at: i, len: 2 };
      i++;
    } else if (c === ">" || c === "<") {
      last = { at: i, len: 1 };
    }
  }
  if (!last) return null;
  let right = expr.slice(last.at + last.len).trim();
  let op = expr.slice(last.at, last.at + last.len);
  const bool = /^bool\b/.exec(right);
  if (bool) {
    op += " bool";
    right = right.slice(4).trim();
  }
  return { left: expr.slice(0, last.at).trim(), op, right };
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const options = { rateInterval: "1m", vars: {} };
  let files = [];
  for (const arg of process.argv.slice(2)) {
    if (arg.startsWith("--rate-interval=")) options.rateInterval = arg.split("=")[1];
    else if (arg.startsWith("--var=")) {
      const [name, ...value] = arg.slice("--var=".length).split("=");
      options.vars[name] = value.join("=");
    } else files.push(arg);
  }
  if (files.length === 0) files = defaultFiles();
  for (const e of collectExpressions(files, options)) {
    console.log(JSON.stringify({ source: e.source, kind: e.kind, expr: e.expr }));
  }
}
