#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, AddressSanitizer and UBSan in build-fuzz
# (its own build folder: the libraries under test are compiled there with the sanitizers) and runs
# each for ORION_FUZZ_SECONDS seconds (default 20) over a copy of its seed corpus
# tests/fuzz/corpus/<target>/; new inputs go to the copy, never into the repo. Exit status non-zero
# on any crash, sanitizer report, leak, timeout or out-of-memory; the crashing input is kept under
# build-fuzz/artifacts/<target>/. Part of tools/test.sh.
#
#   bash tools/fuzz.sh                                  # every target, 20 s each
#   ORION_FUZZ_SECONDS=600 bash tools/fuzz.sh config_fuzz
#   build-fuzz/tests/fuzz/config_fuzz CRASH_FILE        # replays one input
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FUZZ_SECONDS="${ORION_FUZZ_SECONDS:-20}"
JOBS="${ORION_JOBS:-$(nproc)}"
BUILD=build-fuzz
ALL_TARGETS=(config_fuzz admin_tokens_fuzz orion_csv_fuzz register_request_fuzz admission_fuzz
             board_drain_fuzz cgroup_cpu_fuzz)
if (($#)); then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi

start_all=$(date +%s)
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DORION_BUILD_FUZZERS=ON -DORION_BUILD_TESTS=OFF > "$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; exit 1; }
build_args=()
for t in "${TARGETS[@]}"; do build_args+=(--target "$t"); done
cmake --build "$BUILD" -j "$JOBS" "${build_args[@]}"
build_s=$(($(date +%s) - start_all))

WORK="$(mktemp -d "${TMPDIR:-/tmp}/orion-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# Leaks count as findings; UBSan stops at the first report (the code is built with
# -fno-sanitize-recover=undefined as well).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=()
summary=()
fuzz_total=0
for t in "${TARGETS[@]}"; do
  seeds="tests/fuzz/corpus/$t"
  [[ -d "$seeds" ]] || { echo "fuzz.sh: no seed corpus $seeds" >&2; exit 1; }
  rm -rf "$BUILD/artifacts/$t"
  mkdir -p "$WORK/$t" "$BUILD/artifacts/$t"
  cp -R "$seeds/." "$WORK/$t/"
  extra=()
  # board_drain_fuzz lays its input over 4 client slot windows and the board's header: 16640
  # bytes in all.
  [[ "$t" == board_drain_fuzz ]] && extra+=(-max_len=16640)
  echo "=== $t: ${FUZZ_SECONDS}s over $(find "$seeds" -type f | wc -l) seed inputs"
  t0=$(date +%s)
  rc=0
  "$BUILD/tests/fuzz/$t" "$WORK/$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t/" \
    "${extra[@]}" > "$WORK/$t.log" 2>&1 || rc=$?
  took=$(($(date +%s) - t0))
  fuzz_total=$((fuzz_total + took))
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|Done [0-9]+ runs" "$WORK/$t.log" || true
  if ((rc != 0)); then
    tail -n 60 "$WORK/$t.log" >&2
    echo "fuzz.sh: $t FAILED (exit $rc); crashing input under $BUILD/artifacts/$t/" >&2
    failed+=("$t")
    summary+=("$t: FAILED after ${took}s")
  else
    summary+=("$t: ok, ${took}s, corpus $(find "$WORK/$t" -type f | wc -l) inputs")
  fi
done

echo "=== fuzz summary"
printf '  %s\n' "${summary[@]}"
echo "fuzz.sh: build ${build_s}s, total fuzz time ${fuzz_total}s (${#TARGETS[@]} targets)," \
     "wall $(($(date +%s) - start_all))s"
if ((${#failed[@]})); then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
