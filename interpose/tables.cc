// Storage of the process-wide bookkeeping tables.
#include "interpose/glibc_compat.h"

#include "interpose/tables.h"

namespace orion::interpose {

constinit KernelRegistry<8192> g_kernels;
constinit KernelRegistry<1024> g_graphs;
constinit AllocationTable<131072> g_allocations;
constinit AllocationTable<16384> g_vmm_handles;
constinit AllocationTable<16384> g_vmm_mappings;
constinit AllocationTable<4096> g_arrays;
constinit AllocationTable<64> g_malloc_heaps;

void ResetTablesAfterFork() {
  g_allocations.ResetLockAfterFork();
  g_vmm_handles.ResetLockAfterFork();
  g_vmm_mappings.ResetLockAfterFork();
  g_arrays.ResetLockAfterFork();
  g_malloc_heaps.ResetLockAfterFork();
  if (g_allocations.size() != 0) g_allocations.Clear();
  if (g_vmm_handles.size() != 0) g_vmm_handles.Clear();
  if (g_vmm_mappings.size() != 0) g_vmm_mappings.Clear();
  if (g_arrays.size() != 0) g_arrays.Clear();
  if (g_malloc_heaps.size() != 0) g_malloc_heaps.Clear();
  // Kernel and graph handles of the parent's contexts are meaningless in the child; the child
  // cannot use the parent's CUDA state, so stale entries are harmless and left alone.
}

}  // namespace orion::interpose
