// The process's fixed-size bookkeeping tables (static storage: no allocation, no constructors
// that run code): kernels seen, graphs instantiated, live allocations, VMM handles,
// CUDA arrays and malloc heaps.
#pragma once

#include "interpose/kernel_registry.h"
#include "interpose/memory_quota.h"

namespace orion::interpose {

extern KernelRegistry<8192> g_kernels;        // CUfunction -> name sent, launches, estimate
extern KernelRegistry<1024> g_graphs;         // CUgraphExec -> kernel nodes (aux)
extern AllocationTable<131072> g_allocations;  // device pointer -> bytes, kind
extern AllocationTable<16384> g_vmm_handles;  // CUmemGenericAllocationHandle -> bytes,
                                              // mappings, references
extern AllocationTable<16384> g_vmm_mappings;  // mapped address -> bytes, handle
extern AllocationTable<4096> g_arrays;        // CUarray / CUmipmappedArray -> estimated bytes
extern AllocationTable<64> g_malloc_heaps;    // CUcontext -> malloc heap size counted

// In a fork child: the parent's allocations and kernels are not the child's.
void ResetTablesAfterFork();

}  // namespace orion::interpose
