#!/usr/bin/env bash
# The test command: installs dependencies, builds everything, runs every test suite (CTest), the
# deploy checks (Helm chart and its package, manifests, dashboards, rules), evaluates every
# dashboard and rule expression in a real Prometheus scraping the built server, and builds and
# checks the image. Exit status 0 only if all pass.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup-deps.sh
JOBS="${ORION_JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS" --timeout 300
bash tools/check-deploy.sh
bash tools/check-promql.sh build
# The image the chart runs, built without a container engine and checked as a runtime sees it
# (root: mmdebstrap and chroot).
if [[ $(id -u) -eq 0 ]]; then
  bash tools/build-image.sh build build/image
  bash tools/check-image.sh build/image
else
  echo "test.sh: not root: the image build and its checks (tools/build-image.sh) are skipped"
fi
# The chart's node pod and sharing pods in real containers (containerd + runc, the check as the
# kubelet over CRI; root, else it says it was skipped).
bash tools/check-pods.sh build
# libFuzzer targets (tests/fuzz) for ORION_FUZZ_SECONDS each, then the test suites under ASan and
# UBSan, then the lock-free and threaded interposer code under TSan (own build folders:
# build-fuzz, build-asan, build-tsan).
bash tools/fuzz.sh
bash tools/sanitize.sh
bash tools/sanitize.sh thread
