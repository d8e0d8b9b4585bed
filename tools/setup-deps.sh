#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing orion-gpu-share needs (idempotent).
# The CUDA toolkit headers are expected under /usr/local/cuda (set ORION_CUDA_INCLUDE_DIR to
# point elsewhere); no GPU or driver is needed to build or to run the tests.
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates unzip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libcivetweb-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcurl4-openssl-dev libssl-dev openssl   # openssl: the webhook TLS test makes a certificate
  prometheus            # promtool (lints /metrics and the rules) and the Prometheus server that
                        # tools/check-promql.sh evaluates every dashboard and rule expression in
  binutils              # objdump: the interposer's export and glibc-version checks
  clang libclang-rt-14-dev llvm  # tools/fuzz.sh: libFuzzer and the sanitizer runtimes (only
                        # recommended by clang), llvm-symbolizer for readable crash stacks
  chromium              # the timeline page drawn headless (tests/tools/timeline_html_test.sh)
)
# Node.js + npm for the schema validation of the Helm chart's rendered manifests; a machine that
# already has them (from another source than Debian) keeps its own.
command -v node > /dev/null || PACKAGES+=(nodejs)
command -v npm > /dev/null || PACKAGES+=(npm)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [[ ! -f "${ORION_CUDA_INCLUDE_DIR:-/usr/local/cuda/include}/cuda.h" ]]; then
  echo "setup-deps: cuda.h not found under ${ORION_CUDA_INCLUDE_DIR:-/usr/local/cuda/include};" \
       "install the CUDA toolkit headers (cuda-cudart-dev) or set ORION_CUDA_INCLUDE_DIR" >&2
  exit 1
fi
