// Validates rendered Kubernetes manifests (multi-document YAML files given as arguments, or
// stdin) against the API schemas shipped in kubernetes-models and the CRD models of
// prometheus-operator and cert-manager. Used by tools/check-deploy.sh, since no API server can
// run in CI to dry-run them. Exits 1 on the first file with an invalid or unknown object.
//
// Usage: node tools/validate-manifests.mjs rendered.yaml [more.yaml ...]
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

// apiVersion "group/version" -> module path prefix of the package that models it.
function modelModule(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "") return `kubernetes-models/${version}/${kind}`;
  if (group === "monitoring.coreos.com") {
    return `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`;
  }
  if (group === "cert-manager.io") return `@kubernetes-models/cert-manager/${group}/${version}/${kind}`;
  return `kubernetes-models/${group}/${version}/${kind}`;
}

async function loadModel(apiVersion, kind) {
  const mod = await import(modelModule(apiVersion, kind));
  return mod[kind] ?? mod.default;
}

let failures = 0;
let checked = 0;
const inputs = process.argv.slice(2);
const sources = inputs.length > 0
  ? inputs.map((f) => [f, readFileSync(f, "utf8")])
  : [["<stdin>", readFileSync(0, "utf8")]];

for (const [file, text] of sources) {
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length > 0) {
      console.error(`${file}: YAML error: ${doc.errors[0].message}`);
      failures++;
      continue;
    }
    const obj = doc.toJSON();
    if (obj === null || obj === undefined) continue;  // empty document
    const where = `${file}: ${obj.kind ?? "?"} ${obj.metadata?.name ?? "?"}`;
    if (!obj.apiVersion || !obj.kind) {
      console.error(`${where}: missing apiVersion or kind`);
      failures++;
      continue;
    }
    let Model;
    try {
      Model = await loadModel(obj.apiVersion, obj.kind);
    } catch (e) {
      console.error(`${where}: no schema for ${obj.apiVersion} ${obj.kind}`);
      failures++;
      continue;
    }
    try {
      new Model(obj).validate();
      checked++;
    } catch (e) {
      console.error(`${where}: ${e.message}`);
      failures++;
    }
  }
}
console.log(`validated ${checked} objects, ${failures} problems`);
process.exit(failures === 0 ? 0 : 1);
