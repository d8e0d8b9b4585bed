#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing orion-gpu-share needs (idempotent).
# The CUDA toolkit headers are expected under /usr/local/cuda (set ORION_CUDA_INCLUDE_DIR to
# point elsewhere); no GPU or driver is needed to build or to run the tests.
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates unzip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libcivetweb-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev    # the agent's JSON (Kubernetes objects, AdmissionReview) with bounds
  libcurl4-openssl-dev libssl-dev openssl   # openssl: the webhook TLS test makes a certificate
  prometheus            # promtool (lints /metrics and the rules) and the Prometheus server that
                        # tools/check-promql.sh evaluates every dashboard and rule expression in
  binutils              # objdump: the interposer's export and glibc-version checks
  clang libclang-rt-14-dev llvm  # tools/fuzz.sh: libFuzzer and the sanitizer runtimes (only
                        # recommended by clang), llvm-symbolizer for readable crash stacks
  chromium              # the timeline page drawn headless (tests/tools/timeline_html_test.sh)
  graphviz              # dot: docs/img/architecture.svg from docs/architecture.dot (tools/gen-docs.py)
  containerd runc bc python3-grpcio python3-grpc-tools python3-yaml  # tools/check-pods.sh: real
                        # containers through CRI, the test kubelet in Python (Debian's gRPC)
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
# Debian's civetweb source package (cmake/civetweb.cmake builds it with OpenSSL 3) into .deps/:
# apt-get source, from the deb-src twins of this machine's own Debian sources, with a private
# list folder so the system's apt configuration is left as it was.
CIVETWEB_VERSION=1.15+dfsg-4
CIVETWEB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.deps/civetweb"
if [[ ! -f "$CIVETWEB_DIR/civetweb_1.15+dfsg.orig.tar.xz" ]]; then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  APT_SRC="$CIVETWEB_DIR/apt"
  mkdir -p "$APT_SRC/sources.list.d" "$APT_SRC/lists/partial"
  : > "$APT_SRC/sources.list"
  if [[ -f /etc/apt/sources.list ]]; then
    sed -nE 's/^deb([[:space:]])/deb-src\1/p' /etc/apt/sources.list > "$APT_SRC/sources.list"
  fi
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] && sed -E 's/^Types:.*/Types: deb-src/' "$f" > "$APT_SRC/sources.list.d/${f##*/}"
  done
  APT_OPTS=(-o "Dir::Etc::SourceList=$APT_SRC/sources.list"
            -o "Dir::Etc::SourceParts=$APT_SRC/sources.list.d"
            -o "Dir::State::Lists=$APT_SRC/lists" -o APT::Sandbox::User=root)
  echo "fetching Debian's civetweb $CIVETWEB_VERSION source package into $CIVETWEB_DIR"
  $SUDO apt-get -qq "${APT_OPTS[@]}" update
  (cd "$CIVETWEB_DIR" &&
     $SUDO apt-get -qq "${APT_OPTS[@]}" source --download-only "civetweb=$CIVETWEB_VERSION") || {
    echo "setup-deps: apt-get source civetweb=$CIVETWEB_VERSION failed; this machine's apt" \
         "sources (/etc/apt/sources.list*) must name a Debian 12 mirror" >&2
    exit 1
  }
  $SUDO rm -rf "$APT_SRC"
  if [[ -n "$SUDO" ]]; then $SUDO chown -R "$(id -u):$(id -g)" "$CIVETWEB_DIR"; fi
fi
if [[ ! -f "${ORION_CUDA_INCLUDE_DIR:-/usr/local/cuda/include}/cuda.h" ]]; then
  echo "setup-deps: cuda.h not found under ${ORION_CUDA_INCLUDE_DIR:-/usr/local/cuda/include};" \
       "install the CUDA toolkit headers (cuda-cudart-dev) or set ORION_CUDA_INCLUDE_DIR" >&2
  exit 1
fi
