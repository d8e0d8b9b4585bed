#!/usr/bin/env bash
# The pod path in real containers: containerd (its built-in CRI server) and runc run the chart's
# pods and sharing pods the way a kubelet would have them run, and the check plays the kubelet
# over the real CRI v1 gRPC API (tools/cri/kubelet.py and its modules, stubs generated from
# proto/k8s/cri/runtime/v1/api.proto). Steps:
#   1. containerd with its own config, root, state and socket under BUILD/check-pods (runc,
#      cgroupfs driver, overlayfs, host-network pods so no CNI), a pause image built here (static
#      tools/cri/pause.c) as sandbox_image, the image of tools/build-image.sh imported with
#      `ctr -n k8s.io images import`, and a minimal Debian root file system (mmdebstrap) as the
#      image of a sharing pod;
#   2. `helm template` of the chart, host folders pointed under BUILD/check-pods/node; the
#      DaemonSet's pod and the webhook Deployment's pod translated into CRI configs (a field the
#      translator does not know fails the check with its name), run with the test kubelet's
#      device plugin registration socket and a test API server (HTTPS, the pod's in-cluster
#      config) that lists the node's pods;
#   3. sharing pods written with only the orion/priority annotation, admitted by the chart's
#      webhook (a real AdmissionReview over HTTPS, its JSON patch applied), given their shares
#      (orion.io/gpu) or high-priority slots (orion.io/gpu-high) by the device plugin's real
#      GetPreferredAllocation and Allocate answers after the resource fit the check plays for
#      the scheduler, run with the runtime's default seccomp profile on the CUDA driver test
#      double; a pod without orion.io/gpu; a hostile pod (static tools/cri/hostile_pod.cc);
#      then the DRA path (dra.enabled): the agent's DRA plugin registered as the kubelet's plugin
#      watcher does, its ResourceSlice, a claim prepared over the DRA v1 gRPC API, the CDI spec
#      it wrote applied to a pod without annotations by the test kubelet (containerd 1.6 has no
#      CDI), the pod at orion-server with the claim's priority and limits, the claim unprepared;
#      last, the node gets the double's second GPU: one high-priority pod per GPU, a third
#      refused by the fit, and a pod of 2 ranks (orion.io/gpu: 2) with one share on each GPU;
#   4. assertions, each printing its figure, and a summary of the figures (see
#      docs/kubernetes.md).
# containerd is stopped and everything it left (containers, shims, mounts, cgroups) removed
# however the check ends.
#   tools/check-pods.sh [BUILD_DIR]      (default build; needs root, a built tree and the image
#                                         from tools/build-image.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "${1:-${ROOT}/build}" && pwd)"
if [[ $(id -u) -ne 0 ]]; then
  echo "check-pods: skipped: needs root (it runs containerd and runc, and mounts)"
  exit 0
fi
# One run at a time per build folder (a second waits for the first, at most 10 minutes).
exec 9> "${BUILD}/check-pods.lock"
if ! flock -w 600 9; then
  echo "check-pods: FAILED: another check-pods run still holds ${BUILD}/check-pods.lock" >&2
  exit 1
fi
VERSION="$(head -n1 "${ROOT}/VERSION")"
IMAGE_TAR="${BUILD}/image/orion-gpu-share-${VERSION}.tar"
WORK="${BUILD}/check-pods"
NODE="${WORK}/node"
SOCK="${WORK}/containerd/containerd.sock"
RUNC_ROOT="${WORK}/runc"
CTR=(ctr -a "${SOCK}" -n k8s.io)
START_S=$(date +%s.%N)
CONTAINERD_PID=""
# What was there before this run (cleanup removes only what the run added).
SHIM_SOCKETS_BEFORE="$(ls /run/containerd/s 2> /dev/null || true)"
KUBEPODS_BEFORE="$(ls -d /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods 2> /dev/null || true)"
RUN_CONTAINERD_EXISTED=0
[[ -e /run/containerd ]] && RUN_CONTAINERD_EXISTED=1
fail() { echo "check-pods: FAILED: $*" >&2; exit 1; }
step() { echo "== [$(printf '%.1f' "$(echo "$(date +%s.%N) - ${START_S}" | bc)") s] $*"; }

# --- cleanup, however the check ends -------------------------------------------------------
cleanup() {
  local rc=$?
  set +e
  # The test kubelet removes its pods when stopped (SIGTERM); what it leaves in 15 s is removed
  # below.
  if [[ -n "${KUBELET_PID:-}" ]] && kill -0 "${KUBELET_PID}" 2> /dev/null; then
    kill "${KUBELET_PID}" 2> /dev/null
    for _ in $(seq 150); do kill -0 "${KUBELET_PID}" 2> /dev/null || break; sleep 0.1; done
    kill -9 "${KUBELET_PID}" 2> /dev/null
    wait "${KUBELET_PID}" 2> /dev/null
  fi
  if [[ ${rc} -ne 0 && -f "${WORK}/containerd.log" ]]; then
    echo "--- containerd log (last 25 lines)" >&2
    tail -n 25 "${WORK}/containerd.log" >&2
  fi
  # Containers still there (a failed or interrupted check): killed and deleted through runc's own
  # state (the shim's runc root is RUNC_ROOT/k8s.io/<namespace>).
  if [[ -d "${RUNC_ROOT}" ]]; then
    while read -r state; do
      local rroot id
      rroot="$(dirname "$(dirname "${state}")")"
      id="$(basename "$(dirname "${state}")")"
      runc --root "${rroot}" kill "${id}" KILL 2> /dev/null
      for _ in $(seq 20); do
        [[ "$(runc --root "${rroot}" state "${id}" 2> /dev/null | grep -o '"status": "[a-z]*"')" == *running* ]] || break
        sleep 0.1
      done
      runc --root "${rroot}" delete -f "${id}" 2> /dev/null
    done < <(find "${RUNC_ROOT}" -name state.json 2> /dev/null)
  fi
  if [[ -n "${CONTAINERD_PID}" ]] && kill -0 "${CONTAINERD_PID}" 2> /dev/null; then
    kill "${CONTAINERD_PID}"
    for _ in $(seq 50); do kill -0 "${CONTAINERD_PID}" 2> /dev/null || break; sleep 0.1; done
    kill -9 "${CONTAINERD_PID}" 2> /dev/null
    wait "${CONTAINERD_PID}" 2> /dev/null
  fi
  # The shims this containerd started (their command line names its socket).
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' 2> /dev/null < "${p}/cmdline" | grep -q "containerd-shim.*-address ${SOCK} "; then
      kill -9 "${p#/proc/}" 2> /dev/null
    fi
  done
  # Mounts under the work folder (overlay root file systems, sandbox /dev/shm), deepest first.
  for _ in 1 2 3; do
    local mounts
    mounts="$(awk -v w="${WORK}/" 'index($2, w) == 1 {print $2}' /proc/self/mounts | sort -r)"
    [[ -z "${mounts}" ]] && break
    for m in ${mounts}; do umount "${m}" 2> /dev/null || umount -l "${m}" 2> /dev/null; done
    sleep 0.2
  done
  # The cgroups of this run's pods (cgroupfs driver; tools/cri/kubelet.py lists them), then the
  # kubepods and QoS folders this run created, if empty.
  for root in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [[ -d "${root}/kubepods" ]] || continue
    if [[ -f "${WORK}/pod-cgroups" ]]; then
      while read -r pod; do
        [[ -d "${root}${pod}" ]] && find "${root}${pod}" -depth -type d -exec rmdir {} \; 2> /dev/null
      done < "${WORK}/pod-cgroups"
    fi
    grep -qxF "${root}/kubepods" <<< "${KUBEPODS_BEFORE:-}" ||
      rmdir "${root}/kubepods/besteffort" "${root}/kubepods/burstable" "${root}/kubepods" 2> /dev/null
  done
  rm -rf "${WORK}/containerd/root" "${WORK}/containerd/state" 2> /dev/null
  # Sockets of shims that were killed (a failed or interrupted check) stay behind: those this
  # check's run added that no process has bound any more.
  for f in /run/containerd/s/*; do
    [[ -S "${f}" ]] || continue
    grep -qxF "${f##*/}" <<< "${SHIM_SOCKETS_BEFORE:-}" && continue
    grep -qF " ${f}" /proc/net/unix || rm -f "${f}"
  done
  # containerd's shim socket folder, when this check created it and it is empty now.
  if [[ "${RUN_CONTAINERD_EXISTED:-1}" == 0 ]]; then rmdir /run/containerd/s /run/containerd 2> /dev/null; fi
  if [[ ${rc} -eq 0 ]]; then
    echo "check-pods: passed in $(printf '%.1f' "$(echo "$(date +%s.%N) - ${START_S}" | bc)") s"
  fi
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- tools --------------------------------------------------------------------------------
need=()
for tool in containerd runc ctr mmdebstrap umoci skopeo openssl bc gcc g++; do
  command -v "${tool}" > /dev/null || need+=("${tool}")
done
/usr/bin/python3 -c 'import grpc, grpc_tools, yaml' 2> /dev/null ||
  need+=(python3-grpcio python3-grpc-tools python3-yaml)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" > /dev/null
fi
[[ -f "${IMAGE_TAR}" ]] || fail "${IMAGE_TAR} is missing: run tools/build-image.sh first"
for f in samples/orion-sample-infer samples/orion-sample-train tools/orion-ctl \
         tests/cuda_double/lib/libcuda.so.1; do
  [[ -f "${BUILD}/${f}" ]] || fail "${BUILD}/${f} is missing: build first"
done
# shellcheck source=tools/helm-env.sh
source "${ROOT}/tools/helm-env.sh"
orion_find_helm

if grep -q " ${WORK}/" /proc/self/mounts; then
  fail "mounts under ${WORK} are left from an earlier run: $(grep " ${WORK}/" /proc/self/mounts | head -3)"
fi
rm -rf "${WORK}"
mkdir -p "${WORK}/containerd" "${WORK}/cni/bin" "${WORK}/cni/conf" "${RUNC_ROOT}" \
  "${NODE}/run/orion" "${NODE}/var/lib/orion" "${NODE}/var/lib/kubelet/device-plugins" \
  "${NODE}/var/lib/kubelet/plugins_registry"

# --- containerd ---------------------------------------------------------------------------
step "containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1 {print $3}')"
cat > "${WORK}/containerd/config.toml" <<TOML
version = 2
root = "${WORK}/containerd/root"
state = "${WORK}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "${SOCK}"
[ttrpc]
  address = "${SOCK}.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "${WORK}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/orion-check/pause:1"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # No negative oom_score_adj for the sandbox (-998) where the check runs without
  # CAP_SYS_RESOURCE (e.g. inside another container): clamp it to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${WORK}/cni/bin"
    conf_dir = "${WORK}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${RUNC_ROOT}/k8s.io"
TOML
containerd --config "${WORK}/containerd/config.toml" > "${WORK}/containerd.log" 2>&1 9>&- &
CONTAINERD_PID=$!
for _ in $(seq 100); do
  [[ -S "${SOCK}" ]] && "${CTR[@]}" version > /dev/null 2>&1 && break
  kill -0 "${CONTAINERD_PID}" 2> /dev/null || fail "containerd exited at start"
  sleep 0.1
done
"${CTR[@]}" version > /dev/null 2>&1 || fail "containerd did not answer on ${SOCK} within 10 s"
echo "containerd pid ${CONTAINERD_PID}, socket ${SOCK}"

# --- images: pause, the project's image, a minimal sample root file system -------------------
# make_image NAME ROOTFS ENTRYPOINT: one-layer OCI image -> docker-archive -> containerd.
make_image() {
  local name="$1" rootfs="$2" entry="$3" dir
  dir="${WORK}/images/$(basename "$1")"
  mkdir -p "${dir}"
  tar --numeric-owner --sort=name -C "${rootfs}" -cf "${dir}/layer.tar" .
  umoci init --layout "${dir}/oci"
  umoci new --image "${dir}/oci:1"
  umoci raw add-layer --image "${dir}/oci:1" "${dir}/layer.tar"
  umoci config --image "${dir}/oci:1" --config.entrypoint="${entry}" \
    --config.env=PATH=/usr/local/bin:/usr/bin:/bin
  skopeo copy --quiet "oci:${dir}/oci:1" "docker-archive:${dir}/image.tar:${name}:1"
  "${CTR[@]}" images import "${dir}/image.tar" > /dev/null || fail "ctr could not import ${name}"
  rm -rf "${dir}"
}
step "images"
mkdir -p "${WORK}/pause-rootfs"
gcc -static -O2 -o "${WORK}/pause-rootfs/pause" "${ROOT}/tools/cri/pause.c"
make_image localhost/orion-check/pause "${WORK}/pause-rootfs" /pause
t=$(date +%s.%N)
"${CTR[@]}" images import "${IMAGE_TAR}" > /dev/null || fail "ctr could not import ${IMAGE_TAR}"
echo "imported ${IMAGE_TAR} ($(du -h "${IMAGE_TAR}" | cut -f1)) in $(echo "$(date +%s.%N) - ${t}" | bc | cut -c1-4) s"
t=$(date +%s.%N)
mirror=()
[[ -f /etc/apt/sources.list.d/debian.sources ]] && mirror=(/etc/apt/sources.list.d/debian.sources)
# shellcheck disable=SC2016
mmdebstrap --quiet --mode=root --variant=essential --include=libstdc++6 \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  bookworm "${WORK}/sample-rootfs" "${mirror[@]}" || fail "mmdebstrap of the sample root file system failed"
make_image localhost/orion-check/sample-base "${WORK}/sample-rootfs" /bin/sh
rm -rf "${WORK}/sample-rootfs"
echo "sample image (mmdebstrap essential + libstdc++6) built and imported in $(echo "$(date +%s.%N) - ${t}" | bc | cut -c1-4) s"
"${CTR[@]}" images ls -q | sed 's/^/  /'
# The hostile pod's program, static (it runs in the project's image, mounted from here).
mkdir -p "${WORK}/hostile"
g++ -std=c++20 -static -O2 -I "${ROOT}" -o "${WORK}/hostile/orion-hostile" \
  "${ROOT}/tools/cri/hostile_pod.cc" || fail "tools/cri/hostile_pod.cc does not build"
chmod 755 "${WORK}/hostile"

# --- the chart ------------------------------------------------------------------------------
step "chart"
# The node's one GPU is the CUDA driver test double's device 0 (its UUID, as the pods' processes
# see it): the server accepts only the GPUs it is given or finds.
read -r ADMIN_PORT METRICS_PORT HEALTH_PORT WEBHOOK_PORT < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(4)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
"${HELM}" template orion "${ROOT}/deploy/helm/orion-gpu-share" --namespace orion-system \
  --set hostPaths.runDir="${NODE}/run/orion" --set hostPaths.libDir="${NODE}/var/lib/orion" \
  --set hostPaths.devicePluginDir="${NODE}/var/lib/kubelet/device-plugins" \
  --set hostPaths.podResourcesDir="${NODE}/var/lib/kubelet/pod-resources" \
  --set dra.enabled=true --set 'highPriority.namespaces={ml}' \
  --set hostPaths.draPluginDir="${NODE}/var/lib/kubelet/plugins/gpu-share.orion.io" \
  --set hostPaths.pluginsRegistryDir="${NODE}/var/lib/kubelet/plugins_registry" \
  --set hostPaths.cdiDir="${NODE}/var/run/cdi" \
  --set 'gpus={GPU-6f72696f-6e2d-7369-6d00-000000000000}' \
  --set server.adminPort="${ADMIN_PORT}" --set server.metricsPort="${METRICS_PORT}" \
  --set agent.healthPort="${HEALTH_PORT}" --set webhook.port="${WEBHOOK_PORT}" > "${WORK}/chart.yaml"
echo "chart rendered (host folders under ${NODE}; admin :${ADMIN_PORT}, metrics :${METRICS_PORT}, agent health :${HEALTH_PORT}, webhook :${WEBHOOK_PORT})"

# --- the kubelet's part ---------------------------------------------------------------------
# What the pods mount from the build (samples, the CUDA driver test double) and orion-ctl,
# copied once: a build running beside the check may relink them at any moment.
SNAP="${WORK}/build-snapshot"
mkdir -p "${SNAP}/samples" "${SNAP}/tests/cuda_double" "${SNAP}/tools"
cp -a "${BUILD}"/samples/orion-sample-* "${SNAP}/samples/"
cp -a "${BUILD}/tests/cuda_double/lib" "${SNAP}/tests/cuda_double/"
cp -a "${BUILD}/tools/orion-ctl" "${SNAP}/tools/"
step "test kubelet (CRI client, device plugin registration, API server)"
/usr/bin/python3 "${ROOT}/tools/cri/kubelet.py" --cri "${SOCK}" --work "${WORK}" --root "${ROOT}" \
  --build "${SNAP}" --rendered "${WORK}/chart.yaml" \
  --sample-image localhost/orion-check/sample-base:1 --node-root "${NODE}" \
  --run-dir "${NODE}/run/orion" --lib-dir "${NODE}/var/lib/orion" \
  --dp-dir "${NODE}/var/lib/kubelet/device-plugins" --admin-port "${ADMIN_PORT}" \
  --metrics-port "${METRICS_PORT}" --webhook-port "${WEBHOOK_PORT}" \
  --hostile "${WORK}/hostile/orion-hostile" 9>&- &
KUBELET_PID=$!
rc=0
wait "${KUBELET_PID}" || rc=$?
KUBELET_PID=""
[[ ${rc} -eq 0 ]] || fail "the test kubelet (tools/cri/kubelet.py) failed, exit status ${rc}"
