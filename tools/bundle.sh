#!/usr/bin/env bash
# Copies the built binaries and the server's non-system shared libraries into one folder that
# runs on another x86-64 Linux machine (e.g. a GPU node without the build dependencies):
#   tools/bundle.sh build .bundle
# Run the server with LD_LIBRARY_PATH=.bundle/lib; the interposer and orion-run need nothing.
set -euo pipefail
BUILD="${1:-build}"
DEST="${2:-.bundle}"
rm -rf "$DEST"
mkdir -p "$DEST/lib"
cp "$BUILD/server/orion-server" "$BUILD/agent/orion-agent" "$BUILD/tools/orion-ctl" "$BUILD/tools/orion-run" \
   "$BUILD/interpose/liborion_interpose.so" "$BUILD"/samples/orion-sample-* "$DEST/"
[[ -x "$BUILD/bench/orion-bench-launch" ]] && cp "$BUILD/bench/orion-bench-launch" "$DEST/"
[[ -x "$BUILD/bench/orion-bench-ring" ]] && cp "$BUILD/bench/orion-bench-ring" "$DEST/"
[[ -e "$BUILD/bench/liborion_cpu_sampler.so" ]] && cp "$BUILD/bench/liborion_cpu_sampler.so" "$DEST/"
for bin in "$DEST/orion-server" "$DEST/orion-agent" "$DEST/orion-ctl"; do
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      # glibc and the C++ runtime come from the target system (newer there is compatible).
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libstdc++.so*|libgcc_s.so*|ld-linux*) ;;
      *) cp -Ln "$lib" "$DEST/lib/" 2>/dev/null || true ;;
    esac
  done
done
# Debug info stays in the build tree: the bundle travels (size limits).
strip --strip-debug "$DEST"/orion-* "$DEST"/lib/* "$DEST"/liborion_cpu_sampler.so 2>/dev/null || true
du -sh "$DEST"
