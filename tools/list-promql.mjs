// Prints every PromQL expression of the Grafana dashboards and the Prometheus rules, one JSON
// object a line ({"source": ..., "expr": ...}), with Grafana variables replaced so Prometheus
// can evaluate them: $node/$gpu -> ".*", $__rate_interval -> the given interval (default 1m),
// label_values(X, l) -> X. CI feeds them to a Prometheus scraping a real orion-server and
// requires each to return data.
//
// Usage: node tools/list-promql.mjs [--rate-interval=1m] [dashboard.json|rules.yaml ...]
//   (defaults: deploy/dashboards/*.json and deploy/k8s/prometheus-rules.yaml)
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
let rateInterval = "1m";
let files = [];
for (const arg of process.argv.slice(2)) {
  if (arg.startsWith("--rate-interval=")) rateInterval = arg.split("=")[1];
  else files.push(arg);
}
if (files.length === 0) {
  const dash = join(root, "deploy/dashboards");
  files = readdirSync(dash).filter((f) => f.endsWith(".json")).map((f) => join(dash, f));
  files.push(join(root, "deploy/k8s/prometheus-rules.yaml"));
}

function grafanaToPromql(expr) {
  const labelValues = /^label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)$/s.exec(expr.trim());
  if (labelValues) expr = labelValues[1];
  return expr
    .replaceAll("$__rate_interval", rateInterval)
    .replaceAll("$__interval", rateInterval)
    .replace(/\$\{?(node|gpu)\}?/g, ".*");
}

// kind: panel | variable | record | alert. Alert expressions return data only while firing;
// evaluate their left-hand side where "returns data" is the check.
function emit(source, expr, kind) {
  console.log(JSON.stringify({ source, kind, expr: grafanaToPromql(expr) }));
}

for (const file of files) {
  if (file.endsWith(".json")) {
    const dash = JSON.parse(readFileSync(file, "utf8"));
    const walk = (panels) => {
      for (const p of panels ?? []) {
        for (const t of p.targets ?? []) if (t.expr) emit(`${file}#${p.title}/${t.refId}`, t.expr, "panel");
        walk(p.panels);
      }
    };
    walk(dash.panels);
    for (const v of dash.templating?.list ?? []) {
      const q = typeof v.query === "string" ? v.query : v.query?.query;
      if (v.type === "query" && q) emit(`${file}#var:${v.name}`, q, "variable");
    }
  } else {
    const rules = parse(readFileSync(file, "utf8"));
    for (const g of rules.groups ?? []) {
      for (const r of g.rules ?? []) emit(`${file}#${g.name}/${r.record ?? r.alert}`, r.expr, r.record ? "record" : "alert");
    }
  }
}
