#!/usr/bin/env bash
# CI check that every PromQL expression of the Grafana dashboards (deploy/dashboards) and of the
# rules the Helm chart ships (its PrometheusRule) returns data from a real Prometheus scraping a
# real orion-server. Uses already-built binaries; no GPU needed (CUDA driver test double).
#
#  1. Renders the chart's PrometheusRule and extracts its rule groups into a plain rule file.
#  2. Starts orion-server (priority mode) and Prometheus (/usr/bin/prometheus, Debian package)
#     on free loopback ports, with a temporary TSDB, scraping /metrics every second and
#     evaluating the rules every second.
#  3. Runs a workload on the simulated GPU so that every metric family gets samples: a
#     high-priority service (busy-period histogram; NVTX "request" ranges: the request latency
#     histogram), a best-effort trainer (throttled at the
#     gate, then paused and resumed through orion-ctl), a best-effort allocator that fills its
#     memory quota, and one malformed registration (orion_registrations_total{result!="ok"}).
#  4. tools/eval-promql.mjs (extraction shared with tools/list-promql.mjs) queries
#     /api/v1/query at "now" and requires a non-empty result with at least one number (not NaN):
#     - dashboard panel targets, with $node/$gpu at "All" (".*") and again at the first value
#       their variable query lists, $__rate_interval/$__interval = 10s (Grafana's value is
#       4 x the 1 s scrape interval at the least); variable queries label_values(X, l) as X,
#       which must have series carrying l;
#     - recording rules: the expression, and the recorded series by name;
#     - alerts: an alert's expression is empty while all is well ("x > threshold"), so the
#       left operand of its top-level comparison must return data (the condition is computed
#       from real series), and the whole expression must evaluate without error;
#     - /api/v1/rules lists every rule of the file with health "ok".
#     Checks are retried once a second until data arrives (at most ORION_PROMQL_DEADLINE_S,
#     default 60 s); failures print the expression, where it comes from and Prometheus' answer.
#
# Usage: tools/check-promql.sh [BUILD_DIR]   (default: the repository's build/)
# Exit status 0 only if every check passed. Processes started here are stopped on exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build}"
[[ -d "${BUILD}" ]] || BUILD="${ROOT}/${BUILD}"
BUILD="$(cd "${BUILD}" && pwd)"
cd "${ROOT}"
CHART="${ROOT}/deploy/helm/orion-gpu-share"
PROMETHEUS="${PROMETHEUS:-/usr/bin/prometheus}"
DEADLINE_S="${ORION_PROMQL_DEADLINE_S:-60}"

for f in server/orion-server tools/orion-run tools/orion-ctl interpose/liborion_interpose.so \
         samples/orion-sample-infer samples/orion-sample-train samples/orion-sample-alloc \
         tests/cuda_double/lib/libcuda.so.1; do
  [[ -e "${BUILD}/${f}" ]] || { echo "check-promql: ${BUILD}/${f} missing (build first)" >&2; exit 1; }
done
[[ -x "${PROMETHEUS}" ]] ||
  { echo "check-promql: ${PROMETHEUS} missing (tools/setup-deps.sh installs prometheus)" >&2; exit 1; }
if [[ ! -d "${ROOT}/tools/node_modules/yaml" ]]; then
  (cd "${ROOT}/tools" && npm install --no-audit --no-fund --silent)
fi

WORK="$(mktemp -d /tmp/orion-promql.XXXXXX)"   # short: the socket path has a length limit
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill "${pid}" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "${pid}" 2>/dev/null || true; done
  if ((rc != 0)); then
    for log in server prometheus train infer alloc; do
      [[ -s "${WORK}/${log}.log" ]] && { echo "-- ${log}.log (last lines)"; tail -n 15 "${WORK}/${log}.log"; }
    done
  fi
  rm -rf "${WORK}"
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
step() { echo "== $*"; }
# Polls "$@" every 0.1 s for up to $WAIT_S seconds (default 30).
wait_for() {
  local what="$1"; shift
  local end=$((SECONDS + ${WAIT_S:-30}))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || { echo "check-promql: timed out waiting for ${what}" >&2; return 1; }
    sleep 0.1
  done
}

step "rule groups of the chart's PrometheusRule"
# shellcheck source=tools/helm-env.sh
source "${ROOT}/tools/helm-env.sh"
orion_find_helm
"${HELM}" template orion-gpu-share "${CHART}" --namespace orion-system \
  --set prometheusRule.enabled=true --show-only templates/prometheusrule.yaml > "${WORK}/prometheusrule.yaml"
(cd "${ROOT}/tools" && node --input-type=module -e '
  import { parse, stringify } from "yaml";
  import { readFileSync } from "node:fs";
  const rule = parse(readFileSync(process.argv[1], "utf8"));
  if (rule?.kind !== "PrometheusRule" || !rule.spec?.groups?.length) throw new Error("no rule groups");
  process.stdout.write(stringify({ groups: rule.spec.groups }));' "${WORK}/prometheusrule.yaml") \
  > "${WORK}/rules.yaml"
if command -v promtool >/dev/null 2>&1; then promtool check rules "${WORK}/rules.yaml"; fi

# Three free loopback ports (admin gRPC, /metrics, Prometheus), chosen by the kernel.
read -r ADMIN_PORT METRICS_PORT PROM_PORT < <(node -e '
  const net = require("net");
  const servers = [0, 1, 2].map(() => net.createServer());
  Promise.all(servers.map((s) => new Promise((r) => s.listen(0, "127.0.0.1", r)))).then(() => {
    console.log(servers.map((s) => s.address().port).join(" "));
    servers.forEach((s) => s.close());
  });')
PROM_URL="http://127.0.0.1:${PROM_PORT}"
METRICS_URL="http://127.0.0.1:${METRICS_PORT}/metrics"

step "orion-server (admin 127.0.0.1:${ADMIN_PORT}, metrics 127.0.0.1:${METRICS_PORT})"
cat > "${WORK}/server.yaml" <<YAML
node_name: promql-check
socket_path: ${WORK}/orion.sock
admin_address: 127.0.0.1:${ADMIN_PORT}
metrics_address: 127.0.0.1:${METRICS_PORT}
mode: priority
YAML
"${BUILD}/server/orion-server" --config "${WORK}/server.yaml" > "${WORK}/server.log" 2>&1 &
PIDS+=($!)
wait_for "orion-server's socket" test -S "${WORK}/orion.sock"
wait_for "orion-server's /metrics" curl -sf -o /dev/null "${METRICS_URL}"

step "prometheus (${PROM_URL})"
cat > "${WORK}/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - ${WORK}/rules.yaml
scrape_configs:
  - job_name: orion-server
    honor_labels: true   # as the chart's ServiceMonitor: keep the server's pod/namespace labels
    static_configs:
      - targets: ["127.0.0.1:${METRICS_PORT}"]
YAML
"${PROMETHEUS}" --config.file="${WORK}/prometheus.yml" --storage.tsdb.path="${WORK}/tsdb" \
  --web.listen-address="127.0.0.1:${PROM_PORT}" --log.level=warn > "${WORK}/prometheus.log" 2>&1 &
PIDS+=($!)
WAIT_S=60 wait_for "prometheus to be ready" curl -sf -o /dev/null "${PROM_URL}/-/ready"

step "workload on the CUDA driver test double (simulated GPU)"
export LD_LIBRARY_PATH="${BUILD}/tests/cuda_double/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
export ORION_SIM_DIR="${WORK}/sim" ORION_SOCKET="${WORK}/orion.sock"
export ORION_ADMIN="127.0.0.1:${ADMIN_PORT}"
RUN=("${BUILD}/tools/orion-run" --interposer "${BUILD}/interpose/liborion_interpose.so")
CTL=("${BUILD}/tools/orion-ctl" --server "${ORION_ADMIN}")
# Each runs far longer than the check; cleanup stops them.
"${RUN[@]}" --priority best-effort -- "${BUILD}/samples/orion-sample-train" --seconds 600 \
  --kernels 20 --kernel-us 1000 > "${WORK}/train.log" 2>&1 &
PIDS+=($!)
TRAINER_PID=$!   # orion-run execs the trainer
"${RUN[@]}" --priority high --latency-target-ms 20 -- "${BUILD}/samples/orion-sample-infer" \
  --rate 200 --requests 1000000 --kernels 4 --kernel-us 200 --nvtx > "${WORK}/infer.log" 2>&1 &
PIDS+=($!)
"${RUN[@]}" --priority best-effort --memory-limit 64Mi -- "${BUILD}/samples/orion-sample-alloc" \
  --chunk 16Mi --hold 600 > "${WORK}/alloc.log" 2>&1 &
PIDS+=($!)
# A registration the server rejects: a request with a wrong header (result="bad-request").
node -e '
  const s = require("net").connect(process.argv[1], () => s.write(Buffer.alloc(64, 0x5a)));
  s.on("data", () => s.end()); s.on("error", () => {}); setTimeout(() => s.destroy(), 2000);' \
  "${ORION_SOCKET}"
clients_json() { "${CTL[@]}" --json clients; }
count_clients() { clients_json | grep -c '"client_id"' || true; }
three_clients() { [[ "$(count_clients)" -ge 3 ]]; }
wait_for "three registered clients" three_clients
TRAINER_ID="$(clients_json | (cd "${ROOT}/tools" && node -e '
  let t = ""; process.stdin.on("data", (d) => (t += d)).on("end", () => {
    const cs = JSON.parse(t).clients ?? [];
    const c = cs.find((x) => String(x.host_pid) === process.argv[1]) ??
      cs.find((x) => (x.process_name ?? "").startsWith("orion-sample-tr"));
    if (!c) throw new Error("trainer not registered: " + t);
    console.log(c.client_id);
  });' "${TRAINER_PID}"))"
echo "pause/resume the trainer (client ${TRAINER_ID})"
"${CTL[@]}" pause "${TRAINER_ID}" > /dev/null
sleep 1
"${CTL[@]}" resume "${TRAINER_ID}" > /dev/null
"${CTL[@]}" clients

step "evaluate every dashboard and rule expression (${PROM_URL})"
node "${ROOT}/tools/eval-promql.mjs" --prometheus="${PROM_URL}" --rules="${WORK}/rules.yaml" \
  --rules-name="PrometheusRule of deploy/helm/orion-gpu-share" --rate-interval=10s \
  --deadline-s="${DEADLINE_S}"
echo "PromQL checks passed (${SECONDS} s)"
