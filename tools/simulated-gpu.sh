#!/usr/bin/env bash
# For machines without an NVIDIA GPU: makes the programs started from this shell use the CUDA
# driver test double (build/tests/cuda_double/lib/libcuda.so.1, a simulated GPU shared by every
# process of this user) instead of NVIDIA's driver. Source it, then follow the quick start:
#   source tools/simulated-gpu.sh
# or run one command on it:
#   bash tools/simulated-gpu.sh build/samples/orion-sample-infer --requests 100
# ORION_SIM_DIR (default /dev/shm/orion-sim-$UID) holds the simulated GPU's state;
# ORION_SIM_MEMORY (default 16Gi) its memory.
orion_double_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/tests/cuda_double/lib"
if [[ ! -e "$orion_double_dir/libcuda.so.1" ]]; then
  echo "simulated-gpu.sh: $orion_double_dir/libcuda.so.1 is missing: build first" \
       "(cmake --build build)" >&2
  [[ "${BASH_SOURCE[0]}" != "$0" ]] && return 1
  exit 1
fi
export LD_LIBRARY_PATH="$orion_double_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  echo "simulated-gpu.sh: programs started from this shell now run on a simulated GPU"
  unset orion_double_dir
  return 0
fi
exec "$@"
