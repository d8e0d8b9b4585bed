// Handle objects of the CUDA driver test double (contexts, streams, events, modules, graphs,
// memory) and the registry that tells a live handle from a stale or forged one.
//
// The double stands in for the NVIDIA driver (libcuda.so.1) on machines without a GPU. Every
// handle it returns is a pointer to one of these objects, registered by kind; every call looks
// its handles up before touching them, so a bad handle yields CUDA_ERROR_INVALID_HANDLE instead
// of a crash. Objects behind handles are never freed: a destroyed handle stays invalid forever
// instead of aliasing a newer object at the same address (tests hand stale handles on purpose).
#pragma once

// Exposes every ABI name of the driver (cuMemAlloc_v2, cuLaunchKernel_ptsz, the unversioned
// legacy entry points ...) with its exact prototype, as the driver itself is built; without it
// cuda.h renames the calls to the newest version and hides the others.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "tests/cuda_double/sim_gpu.h"

namespace orion::cuda_double {

enum class Kind : uint8_t {
  kContext,
  kStream,
  kEvent,
  kModule,
  kFunction,
  kGraph,
  kGraphNode,
  kGraphExec,
  kMemPool,
  kVmmHandle,
  kArray,
  kMipmappedArray,
};

struct Graph;

struct Stream;
struct Event;

// Work queued on a stream that the simulated device has not taken yet: everything behind a
// stream wait whose word does not hold, or behind a collective still waiting for its peer, or a
// kernel for a device that another process's collective holds. Launches return at once, as the
// real driver's do; the process's front-end thread moves the work on, in stream order.
struct QueuedWork {
  enum class Type : uint8_t { kKernel, kWait, kEventRecord };
  Type type = Type::kKernel;
  bool collective = false;  // kernels: a communication kernel of a simulated job (sim_job.h)
  uint64_t duration_ns = 0;
  uint64_t seq = 0;                              // collectives: the job's sequence number
  const std::atomic<uint32_t>* word = nullptr;  // waits (cuStreamWaitValue32)
  uint32_t value = 0;
  unsigned int flags = 0;
  Event* event = nullptr;  // event records
};

struct Context {
  static constexpr Kind kKind = Kind::kContext;
  int device = 0;
  uint64_t id = 0;  // cuCtxGetId: unique in the process, never reused
  SimGpu* gpu = nullptr;
  bool primary = false;
  int primary_refs = 0;
  // Latest end of any kernel of this context: what cuCtxSynchronize waits for.
  std::atomic<uint64_t> last_end_ns{0};
  Stream* default_stream = nullptr;
  size_t malloc_heap_bytes = 8u << 20;  // cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)
};

struct Stream {
  static constexpr Kind kKind = Kind::kStream;
  Context* ctx = nullptr;
  unsigned int flags = 0;
  std::atomic<uint64_t> last_end_ns{0};  // end of the last kernel placed on the device
  Graph* capture = nullptr;              // non-null while capturing (registry mutex)
  // Work not on the device yet, in order (registry mutex); the stream is done once this is
  // empty, no collective of it is open and last_end_ns has passed.
  std::deque<QueuedWork> queue;
  bool listed = false;           // in DriverState::queued_streams
  bool collective_open = false;  // its last kernel is a collective waiting for its peer
};

// CUDA arrays: handles only (the double keeps no texture memory).
struct Array {
  static constexpr Kind kKind = Kind::kArray;
  Context* ctx = nullptr;
};
struct MipmappedArray {
  static constexpr Kind kKind = Kind::kMipmappedArray;
  Context* ctx = nullptr;
};

struct Event {
  static constexpr Kind kKind = Kind::kEvent;
  Context* ctx = nullptr;
  unsigned int flags = 0;
  bool recorded = false;
  uint64_t time_ns = 0;  // when the simulated GPU reaches the event (UINT64_MAX: still queued)
};

struct Function;
struct Module {
  static constexpr Kind kKind = Kind::kModule;
  Context* ctx = nullptr;
  bool names_known = false;  // PTX text: entry names are checked; binary images: any name
  std::vector<std::string> entries;
  std::vector<Function*> functions;
};

struct Function {
  static constexpr Kind kKind = Kind::kFunction;
  Module* module = nullptr;
  std::string name;
  bool spin = false;  // orion_spin: first parameter is its duration in nanoseconds
  // ...and named as a collective (contract::IsCommunicationKernelName): in a simulated job it
  // pairs with its peer's (sim_job.h).
  bool collective = false;
};

struct GraphNode {
  static constexpr Kind kKind = Kind::kGraphNode;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  Function* func = nullptr;  // kernel nodes
  uint64_t duration_ns = 0;  // kernel nodes, fixed at capture like the real parameters
  uint64_t copy_dst = 0;     // memcpy nodes: plain addresses (host or simulated device)
  uint64_t copy_src = 0;
  size_t copy_bytes = 0;      // memcpy and memset nodes
  uint32_t memset_value = 0;  // memset nodes: element value and width (1 or 4 bytes)
  uint32_t memset_width = 0;
  uint64_t mem_dptr = 0;  // memory allocation and free nodes: the allocation's address
  size_t mem_bytes = 0;   // memory allocation nodes
};

struct Graph {
  static constexpr Kind kKind = Kind::kGraph;
  Context* ctx = nullptr;
  std::vector<GraphNode*> nodes;
  // A capture (global mode) that a call unsafe during captures invalidated: its end fails.
  bool invalidated = false;
};

struct GraphExec {
  static constexpr Kind kKind = Kind::kGraphExec;
  Context* ctx = nullptr;
  std::vector<GraphNode> nodes;  // copies: the source graph may be changed or destroyed
};

struct MemPool {
  static constexpr Kind kKind = Kind::kMemPool;
  int device = 0;
};

// Physical memory of cuMemCreate: a memfd, so that cuMemMap can place it at any reserved
// address and copies through the mapping really move bytes.
struct VmmHandle {
  static constexpr Kind kKind = Kind::kVmmHandle;
  SimGpu* gpu = nullptr;
  size_t size = 0;
  int fd = -1;
  int mappings = 0;
  int references = 1;  // creation and cuMemRetainAllocationHandle, less cuMemRelease
  bool released = false;
  bool imported = false;  // cuMemImportFromShareableHandle: its exporter's memory
};

enum class AllocationKind : uint8_t { kDevice, kPitch, kManaged, kAsync, kPool, kVmmMapped };

struct Allocation {
  size_t size = 0;
  AllocationKind kind = AllocationKind::kDevice;
  SimGpu* gpu = nullptr;     // capacity is returned here on free (not for kVmmMapped)
  VmmHandle* vmm = nullptr;  // kVmmMapped only
};

// Everything mutable that is not per-thread. One mutex: the double favours obviously correct
// over fast; the launch path holds it only for look-ups.
struct DriverState {
  std::mutex mu;
  bool initialized = false;
  std::unordered_map<const void*, Kind> live;
  Context* primary[kMaxSimDevices] = {};
  std::map<uint64_t, Allocation> allocations;  // base address -> allocation or VMM mapping
  std::map<uint64_t, size_t> reservations;     // cuMemAddressReserve ranges
  std::map<uint64_t, size_t> host_registered;  // cuMemHostRegister ranges (device address = host)
  std::set<Graph*> open_captures;               // graphs of the captures begun and not ended

  // The front end: work queued on streams, collectives waiting for their peers, and the thread
  // that moves them on (started on first need, again after fork).
  struct OpenCollective {
    Stream* stream = nullptr;
    uint64_t seq = 0;
    uint64_t start_ns = 0;     // simulated start (may be ahead of the clock)
    uint64_t duration_ns = 0;  // once the peer has started
    uint64_t opened_ns = 0;    // when it started waiting, for the time limit
  };
  struct OwnDevice {
    int open_collectives = 0;  // this process's collectives holding the device open-ended
    uint64_t lane_until = 0;   // end of this process's kernels placed beside them
  };
  std::vector<Stream*> queued_streams;
  std::vector<OpenCollective> open_collectives;
  OwnDevice own[kMaxSimDevices];
  uint64_t collective_seq = 0;       // next collective's sequence number in the job
  uint64_t collective_timeouts = 0;  // collectives that gave up waiting for their peer
  std::condition_variable front_end_wake;
  int front_end_pid = 0;
  uint64_t stream_waits = 0;                   // cuStreamWaitValue32 calls that succeeded
  uint64_t context_queries = 0;                // cuCtxGetCurrent calls
  uint64_t kernel_launches = 0;                // kernels queued to run (captured ones not)
  // When each of the first kMaxLaunchEntries of them entered the driver (CLOCK_MONOTONIC).
  static constexpr size_t kMaxLaunchEntries = 64;
  uint64_t launch_entered_ns[kMaxLaunchEntries] = {};

  template <typename T>
  T* Find(const void* handle) {
    if (handle == nullptr) return nullptr;
    auto it = live.find(handle);
    if (it == live.end() || it->second != T::kKind) return nullptr;
    return static_cast<T*>(const_cast<void*>(handle));
  }
  template <typename T>
  T* Add(T* object) {
    live[object] = T::kKind;
    return object;
  }
  void Remove(const void* handle) { live.erase(handle); }
};

// Leaked singleton: usable from static destructors and atexit handlers of the host program.
DriverState& State();

}  // namespace orion::cuda_double
