#!/usr/bin/env bash
# CI check of everything under deploy/: helm lint and helm template of the chart under several
# value sets, schema validation of every rendered object and of the examples, promtool on the
# rules, the dashboards' JSON, and that deploy/k8s and the chart's dashboard copies equal what
# tools/render-k8s.sh produces. Needs bash, node + npm, unzip, promtool (optional: skipped with
# a note when absent). Exit status 0 only if all checks pass.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="${ROOT}/deploy/helm/orion-gpu-share"
# shellcheck source=tools/helm-env.sh
source "${ROOT}/tools/helm-env.sh"
orion_find_helm
WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
step() { echo "== $*"; }

step "node packages for schema validation"
if [[ ! -d "${ROOT}/tools/node_modules/kubernetes-models" ]]; then
  (cd "${ROOT}/tools" && npm install --no-audit --no-fund --silent)
fi

step "one version: VERSION, the chart's version and appVersion"
VERSION="$(head -n1 "${ROOT}/VERSION")"
for key in version appVersion; do
  got="$(sed -n "s/^${key}: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "${CHART}/Chart.yaml")"
  if [[ "${got}" != "${VERSION}" ]]; then
    echo "check-deploy: Chart.yaml ${key} is '${got}', VERSION says '${VERSION}'" >&2
    exit 1
  fi
done
echo "${VERSION}"

step "helm lint"
"${HELM}" lint --strict "${CHART}"
"${HELM}" lint --strict "${CHART}" --set webhook.tls.mode=certManager \
  --set serviceMonitor.enabled=true --set prometheusRule.enabled=true

step "helm template + schema validation"
declare -A VALUE_SETS=(
  [default]=""
  [monitoring]="--set serviceMonitor.enabled=true --set prometheusRule.enabled=true"
  [cert-manager]="--set webhook.tls.mode=certManager"
  [existing-secret]="--set webhook.tls.mode=secret --set webhook.tls.existingSecret=my-tls --set webhook.tls.caBundle=Zm9v"
  [no-webhook]="--set webhook.enabled=false --set dashboards.enabled=false --set gpus={GPU-0,GPU-1}"
  [gpu-operator]="--set runtimeClassName=nvidia"
  [cdi]="--set runtimeClassName=nvidia --set deviceListStrategy=cdi-cri"
  [mps-daemon]="--set runtimeClassName=nvidia --set mps.daemon.enabled=true --set server.mode=mps"
  [high-priority]="--set highPriorityPerGpu=2 --set highResourceName=example.com/gpu-high --set highPriority.namespaces={serving,prod}"
  [dra]="--set dra.enabled=true"
  [high-priority-policy]="--set dra.enabled=true --set highPriority.namespaces={serving,prod} --set highPriority.admissionPolicy=true"
  [admin-tls]="--set server.adminTls.secretName=orion-admin-tls --set server.adminTls.requireClientCertificates=true --set server.adminAuth.serviceAccounts.readers={monitoring/grafana}"
)
for name in "${!VALUE_SETS[@]}"; do
  # shellcheck disable=SC2086
  "${HELM}" template orion-gpu-share "${CHART}" --namespace orion-system \
    ${VALUE_SETS[$name]} > "${WORK}/${name}.yaml"
  echo -n "${name}: "
  node "${ROOT}/tools/validate-manifests.mjs" "${WORK}/${name}.yaml"
done
if "${HELM}" template x "${CHART}" --set webhook.tls.mode=bogus >/dev/null 2>&1; then
  echo "a bad webhook.tls.mode must fail to render" >&2
  exit 1
fi
if "${HELM}" template x "${CHART}" --set highPriorityPerGpu=0 >/dev/null 2>&1; then
  echo "highPriorityPerGpu=0 must fail to render" >&2
  exit 1
fi
# The policies keeping high-priority slots (orion.io/gpu-high, class gpu-high.orion.io) to
# highPriority.namespaces: three, each with its binding, only when asked for and a list is set.
policies="$(grep -c '^kind: ValidatingAdmissionPolicy$' "${WORK}/high-priority-policy.yaml" || true)"
bindings="$(grep -c '^kind: ValidatingAdmissionPolicyBinding$' "${WORK}/high-priority-policy.yaml" || true)"
if [[ "${policies}" != 3 || "${bindings}" != 3 ]] ||
   ! grep -qF 'request.namespace in [\"serving\",\"prod\"]' "${WORK}/high-priority-policy.yaml"; then
  echo "check-deploy: highPriority.admissionPolicy must render 3 policies and 3 bindings for" \
       "the listed namespaces (got ${policies}, ${bindings})" >&2
  exit 1
fi
if grep -q 'ValidatingAdmissionPolicy' "${WORK}/high-priority.yaml" "${WORK}/default.yaml"; then
  echo "check-deploy: ValidatingAdmissionPolicies rendered without highPriority.admissionPolicy" >&2
  exit 1
fi
if "${HELM}" template x "${CHART}" --set highPriority.admissionPolicy=true |
   grep -q 'ValidatingAdmissionPolicy'; then
  echo "check-deploy: highPriority.admissionPolicy without namespaces must render no policy" >&2
  exit 1
fi
echo "high-priority-policy: 3 policies and their bindings, only when asked for"
echo -n "examples: "
node "${ROOT}/tools/validate-manifests.mjs" "${ROOT}"/deploy/examples/*.yaml

step "bad values fail at install with a message that names them (values.schema.json)"
for bad in "server.mode=turbo|/server/mode" "sharesPerGpu=0|/sharesPerGpu" \
           "webhook.tls.mode=vault|/webhook/tls/mode" "servr.mode=mps|additional properties 'servr'" \
           "deviceListStrategy=volume-mounts|/deviceListStrategy" "mps.daemon.enable=true|'enable'"; do
  set_arg="${bad%%|*}"; want="${bad#*|}"
  if out="$("${HELM}" template orion-gpu-share "${CHART}" --set "${set_arg}" 2>&1)"; then
    echo "check-deploy: --set ${set_arg} was accepted" >&2; exit 1
  fi
  grep -qF "${want}" <<< "${out}" ||
    { echo "check-deploy: --set ${set_arg} failed without naming ${want}: ${out}" >&2; exit 1; }
  echo "--set ${set_arg}: refused ($(grep -F "${want}" <<< "${out}" | head -n1 | sed 's/^ *//'))"
done

step "the chart as users get it: helm package, a repository index, install from the tgz"
# ORION_CHART_DIR keeps the package and index.yaml (default: a temporary folder).
CHARTS="${ORION_CHART_DIR:-${WORK}/charts}"
mkdir -p "${CHARTS}"
"${HELM}" package "${CHART}" --destination "${CHARTS}" > /dev/null
TGZ="${CHARTS}/orion-gpu-share-${VERSION}.tgz"
[[ -f "${TGZ}" ]] || { echo "check-deploy: helm package made no ${TGZ}" >&2; exit 1; }
"${HELM}" repo index "${CHARTS}"
grep -q "version: ${VERSION}" "${CHARTS}/index.yaml" ||
  { echo "check-deploy: index.yaml does not list ${VERSION}" >&2; exit 1; }
# Nothing random (made certificates, made tokens), so that the two renderings compare.
FIXED=(--set server.adminAuth.existingSecret=tokens --set webhook.tls.mode=certManager)
"${HELM}" template orion-gpu-share "${TGZ}" --namespace orion-system "${FIXED[@]}" \
  > "${WORK}/from-tgz.yaml"
"${HELM}" template orion-gpu-share "${CHART}" --namespace orion-system "${FIXED[@]}" \
  > "${WORK}/from-dir.yaml"
cmp -s "${WORK}/from-tgz.yaml" "${WORK}/from-dir.yaml" ||
  { echo "check-deploy: the packaged chart renders differently from the folder" >&2; exit 1; }
echo -n "$(basename "${TGZ}"): "
node "${ROOT}/tools/validate-manifests.mjs" "${WORK}/from-tgz.yaml"

step "deploy/k8s equals the chart's rendering"
mkdir -p "${WORK}/k8s"
HELM="${HELM}" "${ROOT}/tools/render-k8s.sh" "${WORK}/k8s" >/dev/null
if ! diff -ru "${ROOT}/deploy/k8s" "${WORK}/k8s"; then
  echo "deploy/k8s is stale: run tools/render-k8s.sh and commit the result" >&2
  exit 1
fi
for f in "${ROOT}"/deploy/dashboards/*.json; do
  cmp "${f}" "${CHART}/dashboards/$(basename "${f}")" ||
    { echo "chart copy of $(basename "${f}") is stale: run tools/render-k8s.sh" >&2; exit 1; }
done
echo -n "deploy/k8s: "
node "${ROOT}/tools/validate-manifests.mjs" "${ROOT}"/deploy/k8s/namespace.yaml \
  "${ROOT}"/deploy/k8s/orion-gpu-share.yaml

step "DRA in the chart (dra.enabled)"
# Off by default: no DeviceClass, no resource.k8s.io rules, no --dra. On: the two device classes
# selecting the driver's shares and high devices, the agent's flags and host folders, and RBAC
# for the claims it reads and the slices it writes.
if grep -qE 'kind: DeviceClass|resource.k8s.io|--dra|resources: \["nodes"\]' "${WORK}/default.yaml"; then
  echo "check-deploy: DRA objects rendered with dra.enabled=false" >&2; exit 1
fi
DRA="${WORK}/dra.yaml"
for want in "kind: DeviceClass" "name: gpu-share.orion.io" "name: gpu-high.orion.io" \
            '!device.attributes["gpu-share.orion.io"].high' \
            "- --dra" "- --dra-plugin-dir=/var/lib/kubelet/plugins/gpu-share.orion.io" \
            "- --dra-registry-dir=/var/lib/kubelet/plugins_registry" "- --cdi-dir=/var/run/cdi" \
            "path: /var/lib/kubelet/plugins_registry" "mountPath: /var/run/cdi" \
            'resources: ["resourceclaims"]' 'resources: ["resourceslices"]' \
            'verbs: ["get", "list", "watch", "create", "update", "delete"]' \
            'resources: ["nodes"]'; do
  grep -qF -- "${want}" "${DRA}" ||
    { echo "check-deploy: dra.enabled=true renders no '${want}'" >&2; exit 1; }
done
[[ "$(grep -c "^kind: DeviceClass" "${DRA}")" == 2 ]] ||
  { echo "check-deploy: dra.enabled=true must render two DeviceClasses" >&2; exit 1; }
if "${HELM}" template x "${CHART}" --set dra.enabled=yes >/dev/null 2>&1; then
  echo "check-deploy: dra.enabled=yes (a string) must fail the schema" >&2; exit 1
fi
echo "dra: DeviceClasses gpu-share.orion.io and gpu-high.orion.io, agent flags, mounts, RBAC"

step "admin API auth in the chart"
# On by default: the server reads tokens from the Secret the chart makes; AgentSync is a socket in
# a volume only the node pod's containers share, never in runDir (which sharing pods mount).
(cd "${ROOT}/tools" && node --input-type=module -e '
  import { parseAllDocuments } from "yaml";
  import { readFileSync } from "node:fs";
  const objs = parseAllDocuments(readFileSync(process.argv[1], "utf8")).map((d) => d.toJSON());
  const fail = (m) => { console.error("check-deploy: " + m); process.exit(1); };
  const cm = objs.find((o) => o?.kind === "ConfigMap" && o.data?.["server.yaml"]);
  const yaml = cm.data["server.yaml"];
  if (!yaml.includes("tokens_file: /etc/orion/admin-tokens/tokens")) fail("admin_auth is not on by default");
  if (!yaml.includes("agent_socket: /run/orion-agent/agent.sock")) fail("agent_socket is not in the pod-local volume");
  const secret = objs.find((o) => o?.kind === "Secret" && o.metadata.name.endsWith("-admin-tokens"));
  if (!secret) fail("no admin tokens Secret");
  const tokens = Buffer.from(secret.data.tokens, "base64").toString();
  if (!/^operator admin \w{40}\nreader reader \w{40}\n$/.test(tokens)) fail("tokens Secret malformed");
  const ds = objs.find((o) => o?.kind === "DaemonSet");
  const agent = ds.spec.template.spec.containers.find((c) => c.name === "agent");
  if (!agent.args.includes("--server-address=unix:/run/orion-agent/agent.sock")) fail("agent does not use the socket");
  const vol = ds.spec.template.spec.volumes.find((v) => v.name === "agent-sync");
  if (!vol?.emptyDir) fail("agent-sync is not a pod-local emptyDir");
  console.log("admin auth on, tokens Secret, AgentSync on a pod-local socket: ok");
' "${WORK}/default.yaml")

step "webhook: probes on the health port, NetworkPolicy admits the webhook port only"
(cd "${ROOT}/tools" && node --input-type=module -e '
  import { parseAllDocuments } from "yaml";
  import { readFileSync } from "node:fs";
  const objs = parseAllDocuments(readFileSync(process.argv[1], "utf8")).map((d) => d.toJSON());
  const fail = (m) => { console.error("check-deploy: " + m); process.exit(1); };
  const dep = objs.find((o) => o?.kind === "Deployment" && o.metadata.name.endsWith("-webhook"));
  const c = dep.spec.template.spec.containers[0];
  const port = (name) => c.ports.find((p) => p.name === name)?.containerPort;
  if (!c.args.includes("--health-address=0.0.0.0:" + port("health"))) fail("no --health-address");
  for (const probe of [c.livenessProbe, c.readinessProbe]) {
    if (probe.httpGet.port !== "health" || probe.httpGet.scheme !== "HTTP") fail("probe not on health");
  }
  const np = objs.find((o) => o?.kind === "NetworkPolicy" && o.metadata.name === dep.metadata.name);
  if (!np) fail("no NetworkPolicy for the webhook");
  const ports = np.spec.ingress.flatMap((r) => r.ports.map((p) => p.port));
  if (JSON.stringify(ports) !== JSON.stringify([port("https")])) fail("webhook NetworkPolicy admits " + ports);
  console.log("webhook probes on port " + port("health") + ", ingress to " + ports + " only: ok");
' "${WORK}/default.yaml")

step "GPU stack combinations in the chart: CDI and the MPS daemon"
(cd "${ROOT}/tools" && node --input-type=module -e '
  import { parseAllDocuments } from "yaml";
  import { readFileSync } from "node:fs";
  const fail = (m) => { console.error("check-deploy: " + m); process.exit(1); };
  const node = (file) => {
    const objs = parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJSON());
    return objs.find((o) => o?.kind === "DaemonSet").spec.template.spec;
  };
  const plain = node(process.argv[1]), cdi = node(process.argv[2]), mps = node(process.argv[3]);
  const agentOf = (spec) => spec.containers.find((c) => c.name === "agent");
  if (!agentOf(plain).args.includes("--device-list-strategy=envvar")) fail("envvar is not the default");
  if (plain.containers.some((c) => c.name === "mps-control-daemon")) fail("MPS daemon on by default");
  if (!agentOf(cdi).args.includes("--device-list-strategy=cdi-cri")) fail("cdi-cri not passed to the agent");
  if (cdi.runtimeClassName !== "nvidia") fail("runtimeClassName not rendered");
  const daemon = mps.containers.find((c) => c.name === "mps-control-daemon");
  if (!daemon) fail("mps.daemon.enabled renders no daemon container");
  if (daemon.command.join(" ") !== "nvidia-cuda-mps-control -f") fail("daemon command: " + daemon.command);
  const env = Object.fromEntries(daemon.env.map((e) => [e.name, e.value]));
  const args = agentOf(mps).args;
  if (!args.includes("--mps-pipe-dir=" + env.CUDA_MPS_PIPE_DIRECTORY)) fail("agent and daemon disagree on the pipe folder");
  const shm = mps.volumes.find((v) => v.name === "mps-shm").hostPath.path;
  if (!args.includes("--mps-shm-dir=" + shm)) fail("agent and daemon disagree on the shared memory");
  if (daemon.volumeMounts.find((m) => m.name === "mps-shm").mountPath !== "/dev/shm") fail("daemon /dev/shm");
  console.log("envvar by default, cdi-cri passed through, MPS daemon and agent agree on pipe and shm: ok");
' "${WORK}/default.yaml" "${WORK}/cdi.yaml" "${WORK}/mps-daemon.yaml")

step "placement: orion.io/gpu-high per GPU, seccomp of the node pod"
(cd "${ROOT}/tools" && node --input-type=module -e '
  import { parseAllDocuments } from "yaml";
  import { readFileSync } from "node:fs";
  const fail = (m) => { console.error("check-deploy: " + m); process.exit(1); };
  const objs = (file) => parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJSON());
  const check = (file, perGpu, resource, namespaces) => {
    const all = objs(file);
    const node = all.find((o) => o?.kind === "DaemonSet").spec.template.spec;
    for (const c of node.containers) {
      if (c.securityContext?.seccompProfile?.type !== "RuntimeDefault") fail(`${file}: node pod container ${c.name} has no seccompProfile RuntimeDefault`);
    }
    const agent = node.containers.find((c) => c.name === "agent").args;
    for (const want of [`--high-priority-per-gpu=${perGpu}`, `--high-resource-name=${resource}`]) {
      if (!agent.includes(want)) fail(`${file}: agent args lack ${want}`);
    }
    const hook = all.find((o) => o?.kind === "Deployment" && o.metadata.name.endsWith("-webhook"));
    if (hook && !hook.spec.template.spec.containers[0].args.includes(`--high-resource-name=${resource}`)) fail(`${file}: webhook lacks --high-resource-name=${resource}`);
    // High pods outside highPriority.namespaces run best-effort: the webhook gives them a share.
    const nsArg = hook?.spec.template.spec.containers[0].args.find((a) => a.startsWith("--high-priority-namespaces="));
    if (hook && (nsArg ?? "") !== (namespaces ? `--high-priority-namespaces=${namespaces}` : "")) fail(`${file}: webhook namespaces arg ${nsArg}, want ${namespaces}`);
    const cm = all.find((o) => o?.kind === "ConfigMap" && o.data?.["server.yaml"]);
    if (!cm.data["server.yaml"].includes(`high_priority_per_gpu: ${perGpu}`)) fail(`${file}: server config lacks high_priority_per_gpu: ${perGpu}`);
  };
  check(process.argv[1], 1, "orion.io/gpu-high", "");
  check(process.argv[2], 2, "example.com/gpu-high", "serving,prod");
  check(process.argv[3], 1, "orion.io/gpu-high", "");
  console.log("gpu-high per GPU passed to agent, webhook and server; every node pod container seccomp RuntimeDefault: ok");
' "${WORK}/default.yaml" "${WORK}/high-priority.yaml" "${WORK}/mps-daemon.yaml")

step "server config rendered by the chart"
SERVER_BIN="${ORION_SERVER_BIN:-${ROOT}/build/server/orion-server}"
if [[ -x "${SERVER_BIN}" ]]; then
  for name in default no-webhook admin-tls high-priority; do
    (cd "${ROOT}/tools" && node --input-type=module -e '
      import { parseAllDocuments } from "yaml";
      import { readFileSync } from "node:fs";
      for (const d of parseAllDocuments(readFileSync(process.argv[1], "utf8"))) {
        const o = d.toJSON();
        if (o?.kind === "ConfigMap" && o.data?.["server.yaml"]) process.stdout.write(o.data["server.yaml"]);
      }' "${WORK}/${name}.yaml") > "${WORK}/server-${name}.yaml"
    (cd "${ROOT}/tools" && "${SERVER_BIN}" --config "${WORK}/server-${name}.yaml" --check-config)
  done
else
  echo "no orion-server binary (set ORION_SERVER_BIN): rendered config not checked"
fi

step "dashboards and rules"
for f in "${ROOT}"/deploy/dashboards/*.json; do
  node -e 'const d = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    if (!d.uid || !Array.isArray(d.panels)) throw new Error("not a dashboard");' "${f}"
done
node "${ROOT}/tools/list-promql.mjs" > "${WORK}/promql.jsonl"
echo "$(wc -l < "${WORK}/promql.jsonl") PromQL expressions listed (tools/list-promql.mjs;" \
  "tools/check-promql.sh evaluates them against Prometheus and orion-server)"
if command -v promtool >/dev/null 2>&1; then
  promtool check rules "${ROOT}/deploy/k8s/prometheus-rules.yaml"
else
  echo "promtool not found: rule syntax not checked"
fi
echo "deploy checks passed"
