// The one contract between liborion_interpose.so (inside user processes) and orion-server:
// the shared-memory areas and the Unix-socket registration protocol.
//
// Both sides include this header and nothing else defines these layouts. Every type is fixed
// width and versioned (magic + version + reserved space); every field that one process writes
// and another reads is a std::atomic of a lock-free width. It depends on libc headers, <atomic>,
// <cstdint> and <cstring> only, so the interposer can use it without libstdc++ at run time.
//
// Three kinds of shared memory, each a memfd the server creates and hands to a client over the
// registration socket (SCM_RIGHTS), so that a tenant reaches only what it was given:
//
//   Board     (one per node; read-only in clients: sealed against writable mappings)
//             BoardHeader | GpuState[kMaxGpus] | ClientSlot[kMaxSlots]
//             everything the server decides: knobs, priority masks, priorities, pause, limits.
//   GateArea  (one per GPU; read-write in the clients of that GPU only)
//             GateHeader | gate words | SlotGate[kMaxSlots]
//             what the gate must share between processes at launch speed: the futex words, the
//             best-effort time in flight and each high-priority client's busy state.
//   ClientArea (one per registration; read-write in that client only)
//             ClientAreaHeader | the client's counters | EventRing
//   QuotaArea (one per pod, shared by the registrations of that pod's processes only; one per
//             registration outside pods): QuotaHeader | the bytes the pod holds. The limit it
//             is checked against is the slot's memory_limit_bytes on the (read-only) board.
//
// Usage (client side):
//   int fds[kRegisterFds]; RegisterReply reply; ReceiveWithFds(sock, &reply, sizeof reply, fds, ...);
//   auto* board = static_cast<const Board*>(mmap(..., PROT_READ, MAP_SHARED, fds[kBoardFd], 0));
//   if (!BoardLooksValid(*board, bytes)) fail_open();
//   auto* area = static_cast<ClientArea*>(mmap(..., PROT_READ | PROT_WRITE, ..., fds[kAreaFd], 0));
//   Event e{}; e.kind = EventKind::kLaunch; ...; area->ring.TryPush(e);
#pragma once

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace orion::contract {

inline constexpr uint32_t kBoardMagic = 0x4D42524Fu;  // "ORBM" little-endian
// 3: the board is read-only in clients; gate words and client counters moved to their own areas
// 4: the memory quota is counted in a QuotaArea per pod (a fourth descriptor)
inline constexpr uint32_t kBoardVersion = 4;
inline constexpr uint32_t kGateMagic = 0x4741524Fu;    // "ORAG"
inline constexpr uint32_t kAreaMagic = 0x4143524Fu;    // "ORCA"
inline constexpr uint32_t kQuotaMagic = 0x5150524Fu;   // "ORPQ"
inline constexpr uint32_t kWireMagic = 0x5057524Fu;   // "ORWP" little-endian
// 2: the reply carries the areas as descriptors; 3: NVTX range events and GPU times on the host
// clock; 4: the reply carries a fourth descriptor, the pod's quota area
inline constexpr uint32_t kWireVersion = 4;

inline constexpr uint32_t kMaxGpus = 16;
inline constexpr uint32_t kMaxSlots = 256;       // live clients per node
inline constexpr uint32_t kRingCapacity = 2048;  // events per client ring, power of two
inline constexpr uint32_t kKernelNameBytes = 80;
inline constexpr uint32_t kGpuUuidBytes = 48;    // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
inline constexpr uint32_t kNoValue32 = 0xFFFFFFFFu;

enum class Priority : uint32_t { kBestEffort = 0, kHigh = 1 };

// How the launch gate of a GPU behaves; published by the server in GpuState::mode.
enum class GateMode : uint32_t {
  kPassThrough = 0,  // record only, never hold a launch
  kPriority = 1,     // Orion-style: hold best-effort launches while high-priority work runs
  kMps = 2,          // MPS nodes: best-effort kernels co-run in space beside high-priority ones
                     // when they fit (SM threshold, complementary class, budget)
};

enum class SlotState : uint32_t { kFree = 0, kActive = 1 };

enum class EventKind : uint32_t {
  kNone = 0,
  kLaunch = 1,       // func, grid, block, shared_mem, stream
  kKernelName = 2,   // func + name (sent once per distinct function)
  kMemAlloc = 3,     // address, bytes, aux = MemoryKind
  kMemFree = 4,      // address, bytes (0 if unknown), aux = MemoryKind
  kMemcpy = 5,       // bytes, stream, aux = CopyDirection
  kMemset = 6,       // bytes, stream
  kGraphLaunch = 7,  // func = CUgraphExec, aux = kernel nodes in the graph, stream
  kKernelTime = 8,   // func, duration_ns measured on the GPU (sampled launches); with
                     // kOnHostClock in flags, cpu_ns is the GPU's start on the host clock
  kThrottled = 9,    // a launch waited duration_ns at the gate (best effort held while
                     // high-priority work ran) or, with kPausedWait, while its client was paused
  kAllocDenied = 10, // an allocation of `bytes` was refused by the memory quota
  kBusyPeriod = 11,  // high-priority client: from the launch that found nothing in flight and
                     // the grace (hp_grace_ns) over, to its last launch/completion before the
                     // next such launch, which reports it; cpu_ns = start, duration_ns = length
  kRange = 12,       // an NVTX range the process closed: name; cpu_ns and duration_ns on the CPU
                     // (push to pop); aux = nesting depth (0 = outermost); with kOnHostClock,
                     // func and bytes are the GPU's start of its first kernel and end of its
                     // last, on the host clock; stream = the stream its end was recorded on
};

// Event::flags bits.
inline constexpr uint32_t kTimedLaunch = 1u;  // kLaunch/kGraphLaunch: a kKernelTime follows
inline constexpr uint32_t kOnHostClock = 2u;  // kKernelTime/kRange: GPU times on the host clock
inline constexpr uint32_t kWarmupSample = 4u; // kKernelTime of one of a kernel's first launches
inline constexpr uint32_t kPausedWait = 8u;   // kThrottled: the wait was the client's pause
// kKernelTime: on a time-sliced GPU, another process's work was in flight when the timed launch
// went out or when it was found complete, and its start event ran on an idle stream (or was not
// placed): its elapsed time may hold the other's time slice (interpose/sample_timing.h).
inline constexpr uint32_t kContendedSample = 16u;

enum class MemoryKind : uint32_t {
  kDevice = 0, kPitch = 1, kManaged = 2, kAsync = 3, kPool = 4, kVmmCreate = 5, kVmmMap = 6,
  kArray = 7,      // cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate (estimated size)
  kMallocHeap = 8, // cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE): the device-side malloc heap
  kGraphAlloc = 9, // cuGraphAddMemAllocNode: a graph's memory-allocation node
};
enum class CopyDirection : uint32_t {
  kUnknown = 0, kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3, kHostToHost = 4,
};

// Plain payload of one event. It crosses the process boundary as atomic words (EventRing).
struct Event {
  EventKind kind;
  uint32_t aux;          // MemoryKind, CopyDirection or graph kernel count
  uint64_t cpu_ns;       // CLOCK_MONOTONIC of the calling process (same clock on one host);
                         // a launch's: when the interposer took it, before the driver call
                         // where anything before the call needs the time, else as it returned
                         // (a high-priority client alone: its busy periods too)
  uint64_t func;         // CUfunction, CUgraphExec, or device address for memory events
  uint64_t stream;
  uint64_t bytes;
  uint64_t duration_ns;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_mem;
  uint32_t flags;        // kTimedLaunch, kOnHostClock, kWarmupSample, kPausedWait, kContended...
  char name[kKernelNameBytes];  // kKernelName, kRange and kStep only; NUL-terminated, truncated
};
inline constexpr size_t kEventWords = 1 + (sizeof(Event) + 7) / 8;  // +1: sequence word
static_assert(sizeof(Event) == 160, "Event payload layout is part of the contract");
static_assert(kEventWords == 21);
// What an event without a name carries: a producer may push only these bytes (a launch writes 10
// words, not 20); the name's words of its ring entry keep whatever was there before, and a
// consumer reads `name` only for the kinds that carry one.
inline constexpr size_t kEventHeadBytes = offsetof(Event, name);
static_assert(kEventHeadBytes % 8 == 0);

// Bounded multi-producer (threads of one client) single-consumer (server) ring.
// A producer claims a position by CAS on head, writes the payload words, then publishes the
// entry by storing seq = position + 1 (release). The consumer reads entries in order while their
// seq matches. A producer never blocks: if the ring is full it counts a drop. A producer killed
// between claim and publish leaves a hole; the server skips it after a timeout (SkipStuckEntry).
struct alignas(64) EventRing {
  std::atomic<uint64_t> head;  // next position to claim (producers)
  // Producers only: a value tail had (never ahead of it). A producer reads tail, a line the
  // consumer writes, only when this one says the ring may be full: once per kRingCapacity
  // events, not once per event. The server neither reads nor trusts it.
  std::atomic<uint64_t> tail_seen;
  uint8_t pad0[48];
  std::atomic<uint64_t> tail;  // next position to read (consumer)
  std::atomic<uint64_t> dropped;  // events lost because the ring was full
  uint8_t pad1[48];
  struct Entry {
    std::atomic<uint64_t> words[kEventWords];
  };
  Entry entries[kRingCapacity];

  // Producer: publishes the first `bytes` of `e` (sizeof(Event), or kEventHeadBytes for an event
  // without a name).
  bool TryPush(const Event& e, size_t bytes = sizeof(Event)) {
    uint64_t pos = head.load(std::memory_order_relaxed);
    for (;;) {
      if (pos - tail_seen.load(std::memory_order_acquire) >= kRingCapacity) {
        const uint64_t t = tail.load(std::memory_order_acquire);
        tail_seen.store(t, std::memory_order_release);
        if (pos - t >= kRingCapacity) {
          dropped.fetch_add(1, std::memory_order_relaxed);
          return false;
        }
      }
      if (head.compare_exchange_weak(pos, pos + 1, std::memory_order_acq_rel,
                                     std::memory_order_relaxed)) {
        break;
      }
    }
    Entry& slot = entries[pos & (kRingCapacity - 1)];
    const auto* payload = reinterpret_cast<const unsigned char*>(&e);
    const size_t words = (bytes < sizeof(Event) ? bytes : sizeof(Event)) / 8;
    // Unrolled where `bytes` is known (a launch's 11 words: 11 stores, no loop).
#pragma GCC unroll 32
    for (size_t i = 0; i < words; ++i) {
      uint64_t word;
      std::memcpy(&word, payload + 8 * i, 8);
      slot.words[i + 1].store(word, std::memory_order_relaxed);
    }
    slot.words[0].store(pos + 1, std::memory_order_release);
    return true;
  }

  // Producer: the entry the next push will claim unless another thread claims it first.
  const Entry& NextEntry() const {
    return entries[head.load(std::memory_order_relaxed) & (kRingCapacity - 1)];
  }

  // Producer, after a push: fetches the lines of the next entry that an event without a name
  // writes (its sequence word and kEventHeadBytes: at most three lines) for writing, without
  // waiting. The consumer read them when the ring last came round, so the next push's stores
  // would each wait for the line to come back from the consumer's core, and the first locked
  // instruction after that push (the application's next reference count, the driver's next
  // lock) would wait for those stores. Prefetched, they arrive while the producer runs up to its
  // next push. Only where CanPrefetchNextEntry() (the caller asks once).
  void PrefetchNextEntry() const {
    const char* entry = reinterpret_cast<const char*>(&NextEntry());
    constexpr size_t kLast = sizeof(uint64_t) + kEventHeadBytes - 1;
#if defined(__x86_64__)
    asm volatile("prefetchw %0" : : "m"(entry[0]));
    asm volatile("prefetchw %0" : : "m"(entry[64]));
    asm volatile("prefetchw %0" : : "m"(entry[kLast]));
#else
    __builtin_prefetch(entry, 1, 3);
    __builtin_prefetch(entry + 64, 1, 3);
    __builtin_prefetch(entry + kLast, 1, 3);
#endif
  }

  // Whether this CPU may run PrefetchNextEntry: on x86 where CPUID has PRFCHW (elsewhere
  // PREFETCHW is not promised to be a hint); elsewhere always (the compiler's store prefetch is
  // one).
  static bool CanPrefetchNextEntry() {
#if defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_PRFCHW) != 0;
#else
    return true;
#endif
  }

  // Consumer: pops the next published event into *out. Returns false if the next entry is not
  // (yet) published. The payload is copied out before tail moves, so the producer cannot
  // overwrite it while it is read.
  bool TryPop(Event* out) {
    const uint64_t t = tail.load(std::memory_order_relaxed);
    if (head.load(std::memory_order_acquire) == t) return false;
    Entry& slot = entries[t & (kRingCapacity - 1)];
    if (slot.words[0].load(std::memory_order_acquire) != t + 1) return false;
    uint64_t raw[kEventWords - 1];
    for (size_t i = 0; i + 1 < kEventWords; ++i) {
      raw[i] = slot.words[i + 1].load(std::memory_order_relaxed);
    }
    std::memcpy(out, raw, sizeof(Event));
    tail.store(t + 1, std::memory_order_release);
    return true;
  }

  // Consumer that keeps its own read position (the server: a tenant can write tail and head, so
  // it never re-reads them per entry): copies the entry at `pos` into *out if it is published.
  // The caller moves tail past it afterwards (a producer may overwrite it only then).
  bool ReadAt(uint64_t pos, Event* out) const {
    const Entry& slot = entries[pos & (kRingCapacity - 1)];
    if (slot.words[0].load(std::memory_order_acquire) != pos + 1) return false;
    uint64_t raw[kEventWords - 1];
    for (size_t i = 0; i + 1 < kEventWords; ++i) {
      raw[i] = slot.words[i + 1].load(std::memory_order_relaxed);
    }
    std::memcpy(out, raw, sizeof(Event));
    return true;
  }

  // Consumer: true if an entry was claimed but is not published (producer slow or dead).
  bool HasPendingHole() const {
    const uint64_t t = tail.load(std::memory_order_relaxed);
    return head.load(std::memory_order_acquire) != t &&
           entries[t & (kRingCapacity - 1)].words[0].load(std::memory_order_acquire) != t + 1;
  }
  // Consumer: gives up on the entry at tail (call only after HasPendingHole held for a while).
  void SkipStuckEntry() { tail.fetch_add(1, std::memory_order_acq_rel); }

  // Server, when a slot is (re)assigned: empty ring. No producer may be attached.
  void Reset() {
    head.store(0, std::memory_order_relaxed);
    tail.store(0, std::memory_order_relaxed);
    dropped.store(0, std::memory_order_relaxed);
    for (auto& entry : entries) entry.words[0].store(0, std::memory_order_relaxed);
  }
};

// One registered client (a process using one GPU), as the server decides it. On the board:
// written by the server only, read-only in clients.
struct alignas(64) ClientSlot {
  std::atomic<uint32_t> state;        // SlotState
  std::atomic<uint32_t> generation;   // bumped each time the slot is assigned
  std::atomic<uint32_t> client_id;
  std::atomic<uint32_t> host_pid;     // from SO_PEERCRED
  std::atomic<uint32_t> gpu;          // board GPU index
  std::atomic<uint32_t> priority;     // Priority; admin may change it at run time
  std::atomic<uint32_t> paused;       // 1: hold every launch until resumed
  std::atomic<uint32_t> profile;      // 1: time kernels on the GPU (sampled)
  std::atomic<uint64_t> memory_limit_bytes;  // 0 = unlimited
  std::atomic<uint32_t> wake_seq;     // futex word for a paused client's threads
  uint8_t reserved[20];
};

// Per-GPU policy as the server publishes it (board: read-only in clients).
struct alignas(64) GpuState {
  std::atomic<uint32_t> present;       // 1 if this index is a GPU of the node
  std::atomic<uint32_t> mode;          // GateMode
  std::atomic<uint64_t> hp_slot_mask[kMaxSlots / 64];  // slots of high-priority clients
  std::atomic<uint64_t> be_budget_ns;   // best-effort GPU time allowed beside HP work
  std::atomic<uint32_t> sm_threshold;   // max blocks of a BE kernel beside HP (mps); 0: any
  std::atomic<uint32_t> spin_ns;        // spin before blocking on the gate word
  std::atomic<uint64_t> hp_stale_ns;    // HP inflight older than this is ignored
  char uuid[kGpuUuidBytes];             // GPU UUID (before any client)
  // An HP client with nothing in flight still counts as busy for this long after its last
  // launch or completion: the CPU gaps between the kernels of one request must not let
  // best-effort work in mid-request. 0 = no grace.
  std::atomic<uint64_t> hp_grace_ns;
  // Active best-effort clients on this GPU. High-priority clients follow their launches to
  // completion only while this is not 0: with nobody to hold back, completions inform nobody.
  std::atomic<uint32_t> be_clients;
  // 1: priority mode holds best-effort work on the GPU (GateArea::Words::gpu_hold) rather than
  // at the gate on the CPU.
  std::atomic<uint32_t> gpu_hold;
  // The longest the GPU hold lasts while the high-priority clients stay busy: past it,
  // best-effort processes open it and wait at the gate on the CPU until their busy period ends
  // (interpose/gpu_hold.h, "A hold that lasts"). 0 = no bound (also a server that predates it).
  std::atomic<uint64_t> gpu_hold_max_ns;
  // How long a process whose hold was opened past that bound waits at the gate on the CPU at
  // least, whether or not the high-priority clients went idle meanwhile. 0 = until they are
  // idle, also what a server that predates it leaves (the server and the interposer of one
  // release go together: the chart ships both).
  std::atomic<uint64_t> gpu_hold_release_ns;
  uint8_t reserved[96];
};

struct alignas(64) BoardHeader {
  uint32_t magic;     // kBoardMagic (written last by the server, release)
  uint32_t version;   // kBoardVersion
  uint32_t header_bytes;
  uint32_t gpu_state_bytes;
  uint32_t slot_bytes;
  uint32_t num_gpus;
  uint32_t max_slots;
  uint32_t ring_capacity;
  std::atomic<uint64_t> server_epoch;  // changes on each server start
  std::atomic<uint64_t> server_heartbeat_ns;  // CLOCK_MONOTONIC, ~every 100 ms
  uint32_t gate_area_bytes;    // sizeof(GateArea)
  uint32_t client_area_bytes;  // sizeof(ClientArea)
  uint32_t quota_area_bytes;   // sizeof(QuotaArea)
  uint8_t reserved[180];
};

struct Board {
  BoardHeader header;
  GpuState gpus[kMaxGpus];
  ClientSlot slots[kMaxSlots];
};

// A high-priority client's busy state, written by that client and read by the gates of every
// best-effort client of its GPU (an entry of a slot not in hp_slot_mask is never read).
struct alignas(64) SlotGate {
  std::atomic<uint32_t> inflight;         // followed HP launches not yet complete
  std::atomic<uint32_t> hp_kernel_class;  // class of the last HP launch (a graph in flight
                                          // stays), kernel_class.h encoding (value + 1; 0 unknown)
  std::atomic<uint32_t> busy_seq;         // bumped when a busy period starts
  // 1: the client's last launch was a CUDA graph; gpu_hold holds best-effort work on the GPU
  // only for such clients (interpose/gpu_hold.h says why).
  std::atomic<uint32_t> launches_graphs;
  std::atomic<uint64_t> busy_start_ns;     // when the current busy period began
  std::atomic<uint64_t> last_progress_ns;  // CLOCK_MONOTONIC of the last launch/completion
  uint8_t reserved[32];
};

struct alignas(64) GateHeader {
  uint32_t magic;    // kGateMagic (written last by the server)
  uint32_t version;  // kBoardVersion
  uint32_t bytes;    // sizeof(GateArea)
  uint32_t gpu;      // board GPU index this area belongs to
  uint64_t server_epoch;
  uint8_t reserved[40];
};

// The launch gate's shared words of one GPU. Mapped read-write by the clients of that GPU only
// (and the server, which checks them every tick: a lie here can hold or release best-effort work
// on this GPU, as a tenant without the interposer could, and nothing else).
struct GateArea {
  GateHeader header;
  struct alignas(64) Words {
    std::atomic<uint32_t> gate_seq;      // futex word: bumped whenever held launches may go
    std::atomic<uint32_t> gate_waiters;  // best-effort threads held at the gate
    // Futex word of the clients' completion trackers: a best-effort thread that starts to wait
    // at the gate bumps it and wakes them, so that they follow completions closely only while
    // somebody is held (gate_waiters > 0) and sleep otherwise.
    std::atomic<uint32_t> tracker_seq;
    // GpuState::gpu_hold: 0 while best-effort work may run on the GPU, else the hold's epoch.
    // Best-effort streams wait on the GPU until it is 0 (cuStreamWaitValue32, EQ 0); a
    // high-priority launch sets it, a best-effort process's hold keeper clears it once the
    // high-priority clients are idle (interpose/gpu_hold.h). Also a futex word for the keepers.
    std::atomic<uint32_t> gpu_hold;
    std::atomic<uint64_t> be_outstanding_ns;  // estimated best-effort work in flight
    // Best-effort GPU time admitted during the current HP busy period: the period's identity
    // (sum of the busy HP slots' busy_seq, low 24 bits) << 40 | nanoseconds (40 bits).
    std::atomic<uint64_t> be_period;
    std::atomic<uint32_t> hold_epoch;    // the last epoch a hold took (never 0 in gpu_hold)
    std::atomic<uint32_t> hold_sleepers; // hold keepers asleep on gpu_hold while it is 0
    // The same hold for the launches a gate on the CPU admitted (a process that cuts GEMMs
    // waits there first): taken with gpu_hold, at the same epoch, and opened also between
    // graphs, when that gate admits, while gpu_hold stays held for the streams held on the GPU
    // alone until the grace ends (interpose/gpu_hold.h). A service whose interposer predates it
    // never sets it: such launches are then held on the CPU only.
    std::atomic<uint32_t> gpu_hold_admitted;
    uint8_t reserved[20];
  } words;
  SlotGate slots[kMaxSlots];
};

struct alignas(64) ClientAreaHeader {
  uint32_t magic;    // kAreaMagic (written last by the server)
  uint32_t version;  // kBoardVersion
  uint32_t bytes;    // sizeof(ClientArea)
  uint32_t slot;     // board slot of the registration
  uint32_t generation;
  uint32_t client_id;
  uint8_t reserved[40];
};

// What one registration writes: its counters and its event ring. Mapped by that client and the
// server only; the server re-validates every value it reads.
struct ClientArea {
  ClientAreaHeader header;
  struct alignas(64) Counters {
    std::atomic<uint64_t> memory_used_bytes;  // bytes currently allocated
    std::atomic<uint64_t> memory_peak_bytes;
    // kernels launched (graph nodes counted); each thread adds its launches in batches, at once
    // while the gate holds it (interpose/client_state.h, CountLaunch)
    std::atomic<uint64_t> launches;
    std::atomic<uint64_t> throttled_ns;       // time launches waited (finished waits)
    // A wait in progress at the gate (or paused) since then; 0: none published; kWaitEnding
    // while its thread moves it into throttled_ns. One waiting thread at a time publishes.
    std::atomic<uint64_t> waiting_since_ns;
    // Times the process's hold keeper opened a GPU hold that had lasted past its bound and held
    // its launches on the CPU instead (interpose/gpu_hold.h, "A hold that lasts").
    std::atomic<uint64_t> hold_releases;
    uint8_t reserved[16];
  } counters;
  EventRing ring;
};

static_assert(sizeof(ClientArea::Counters) == 64);

// A client's held time so that a reader sees a wait before it ends: the waiting thread
// publishes its start (PublishWaitStart, true if it is the one published) and, when the wait
// ends, adds it to throttled_ns (EndWait). The published one is first marked kWaitEnding and
// cleared only after the add (release): a reader that finds the add (HeldNs reads throttled_ns
// with acquire, then the start) finds the mark or what came after it, never the start, so no
// wait is counted twice; a reader between the two may miss the wait for that moment. Every
// word is the client's to write: the server shows what it reads (its metric never goes back)
// and decides nothing on it.
inline constexpr uint64_t kWaitEnding = UINT64_MAX;
inline bool PublishWaitStart(ClientArea::Counters& c, uint64_t start_ns) {
  uint64_t none = 0;
  return start_ns != 0 && start_ns != kWaitEnding &&
         c.waiting_since_ns.compare_exchange_strong(none, start_ns, std::memory_order_relaxed);
}
inline void EndWait(ClientArea::Counters& c, uint64_t waited_ns, bool published) {
  if (!published) {
    c.throttled_ns.fetch_add(waited_ns, std::memory_order_relaxed);
    return;
  }
  c.waiting_since_ns.store(kWaitEnding, std::memory_order_relaxed);
  c.throttled_ns.fetch_add(waited_ns, std::memory_order_release);
  c.waiting_since_ns.store(0, std::memory_order_release);
}
inline uint64_t HeldNs(const ClientArea::Counters& c, uint64_t now_ns) {
  const uint64_t done = c.throttled_ns.load(std::memory_order_acquire);
  const uint64_t since = c.waiting_since_ns.load(std::memory_order_relaxed);
  const bool waiting = since != 0 && since != kWaitEnding && since <= now_ns;
  return done + (waiting ? now_ns - since : 0);
}

// The memory a pod holds, counted by every process of the pod against its limit (the board's
// ClientSlot::memory_limit_bytes, the same for each of the pod's slots). Mapped read-write by the
// registrations of that pod's processes only (outside pods: by one registration), so what a
// tenant writes here decides its own quota and nobody else's. A process reserves with a
// compare-and-swap before the real allocation (never past the limit, never wrapping) and gives
// back after a failed allocation or a free; the server gives back what a departing client still
// held (its ClientArea's memory_used_bytes), and drops the area with the pod's last client.
struct alignas(64) QuotaHeader {
  uint32_t magic;    // kQuotaMagic (written last by the server)
  uint32_t version;  // kBoardVersion
  uint32_t bytes;    // sizeof(QuotaArea)
  uint32_t reserved0;
  uint64_t server_epoch;
  uint8_t reserved[40];
};
struct QuotaArea {
  QuotaHeader header;
  struct alignas(64) Counters {
    std::atomic<uint64_t> used_bytes;  // bytes the pod's processes hold (reserved)
    std::atomic<uint64_t> peak_bytes;
    uint8_t reserved[48];
  } counters;
};

static_assert(sizeof(BoardHeader) == 256);
static_assert(sizeof(QuotaArea) == 128);
static_assert(sizeof(GpuState) == 256);
// The fields end where the reserved space begins, and it ends where alignment would pad: a
// field added without taking its bytes from `reserved` fails here, not only past 256.
static_assert(offsetof(GpuState, gpu_hold_release_ns) == 136);
static_assert(offsetof(GpuState, reserved) == 144 &&
              offsetof(GpuState, reserved) + sizeof(GpuState::reserved) == 240);
static_assert(sizeof(ClientSlot) == 64);
static_assert(sizeof(SlotGate) == 64);
static_assert(sizeof(GateArea) == 128 + kMaxSlots * sizeof(SlotGate));
static_assert(offsetof(ClientArea, ring) == 128);
static_assert(sizeof(EventRing::Entry) == kEventWords * 8);
static_assert(offsetof(Board, gpus) == 256);
static_assert(offsetof(Board, slots) == 256 + kMaxGpus * sizeof(GpuState));
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert((kRingCapacity & (kRingCapacity - 1)) == 0);

inline constexpr size_t kBoardBytes = sizeof(Board);

// Client checks before trusting a mapping.
inline bool BoardLooksValid(const Board& b, size_t mapped_bytes) {
  return mapped_bytes >= sizeof(Board) && b.header.magic == kBoardMagic &&
         b.header.version == kBoardVersion && b.header.header_bytes == sizeof(BoardHeader) &&
         b.header.gpu_state_bytes == sizeof(GpuState) &&
         b.header.slot_bytes == sizeof(ClientSlot) && b.header.max_slots == kMaxSlots &&
         b.header.ring_capacity == kRingCapacity && b.header.num_gpus <= kMaxGpus &&
         b.header.gate_area_bytes == sizeof(GateArea) &&
         b.header.client_area_bytes == sizeof(ClientArea) &&
         b.header.quota_area_bytes == sizeof(QuotaArea);
}
inline bool GateLooksValid(const GateArea& g, size_t mapped_bytes, uint32_t gpu) {
  return mapped_bytes >= sizeof(GateArea) && g.header.magic == kGateMagic &&
         g.header.version == kBoardVersion && g.header.bytes == sizeof(GateArea) &&
         g.header.gpu == gpu;
}
inline bool AreaLooksValid(const ClientArea& a, size_t mapped_bytes, uint32_t slot,
                           uint32_t generation) {
  return mapped_bytes >= sizeof(ClientArea) && a.header.magic == kAreaMagic &&
         a.header.version == kBoardVersion && a.header.bytes == sizeof(ClientArea) &&
         a.header.slot == slot && a.header.generation == generation;
}
// A quota area outlives the registrations of its pod, and every process of the pod can write its
// header: a header written over must not make the pod's next processes fail open (uncounted).
// So only its size is checked (the server seals it against shrinking); the layout's version is
// the board's, which clients cannot write.
inline bool QuotaLooksValid(const QuotaArea&, size_t mapped_bytes) {
  return mapped_bytes >= sizeof(QuotaArea);
}

// ---- Unix-socket registration protocol (SOCK_STREAM, default /run/orion/orion.sock) ----
//
// The client connects, sends one RegisterRequest, reads one RegisterReply and keeps the
// connection open for the life of the registration: the server frees the slot when the
// connection closes (exit, crash, SIGKILL). The client may send a Goodbye message first.
// Identity (pid, uid, pod, container) comes from SO_PEERCRED and /proc, never from the request.
// A kOk reply carries kRegisterFds descriptors (SCM_RIGHTS) with its first byte, in the order
// of RegisterFd: the node's board (sealed: no writable mapping can be made of it), the GPU's
// gate area, the client's own area and its pod's quota area. Nothing is opened by path, so the run folder can be
// mounted read-only into pods.

enum class MessageType : uint32_t { kRegister = 1, kRegisterReply = 2, kGoodbye = 3 };

enum class RegisterStatus : uint32_t {
  kOk = 0,
  kBadRequest = 1,   // wrong magic/version/size or malformed fields
  kNoSlot = 2,       // all kMaxSlots slots are taken
  kUnknownGpu = 3,   // the UUID/ordinal matches no GPU of the board
  kRefused = 4,      // policy refused the client (message says why)
};

struct MessageHeader {
  uint32_t magic;    // kWireMagic
  uint32_t version;  // kWireVersion
  uint32_t type;     // MessageType
  uint32_t bytes;    // sizeof the whole message
};

struct RegisterRequest {
  MessageHeader header;
  uint32_t claimed_pid;        // informative only (the server uses SO_PEERCRED)
  uint32_t device_ordinal;     // CUdevice ordinal as the process sees it
  char gpu_uuid[kGpuUuidBytes];  // from cuDeviceGetUuid, "GPU-..." form; empty if unknown
  uint32_t requested_priority;   // Priority, or kNoValue32; honoured only in standalone mode
  uint32_t flags;                // reserved, 0
  uint64_t requested_memory_limit;  // bytes, 0 = none; honoured only in standalone mode
  uint64_t requested_latency_target_us;  // 0 = none; standalone only
  char process_name[64];         // argv[0] basename, informative
  // CPUs the process may use (affinity, cgroup quota) in thousandths; kNoValue32 = no limit
  // found. Informative (shown to operators); senders of wire v2 before it left it 0.
  uint32_t usable_millicpus;
  // The job the process is a rank of (orion-run --job, ORION_JOB): lowercase letters, digits,
  // '-' and '.', at most 63; empty = none. Honoured only in standalone mode and when trusted,
  // as requested_priority; senders before it left it zero.
  char requested_job[64];
  uint8_t reserved[28];
};

struct RegisterReply {
  MessageHeader header;
  uint32_t status;       // RegisterStatus
  uint32_t client_id;
  uint32_t slot;         // index into Board::slots
  uint32_t generation;   // ClientSlot::generation at assignment
  uint32_t gpu;          // board GPU index
  uint32_t priority;     // Priority as decided by the server
  uint64_t memory_limit_bytes;
  uint64_t server_epoch;
  uint8_t reserved0[128];
  char message[128];     // human-readable reason when status != kOk
  uint8_t reserved[72];
};

enum RegisterFd : int { kBoardFd = 0, kGateFd = 1, kAreaFd = 2, kQuotaFd = 3, kRegisterFds = 4 };

struct Goodbye {
  MessageHeader header;
  uint8_t reserved[48];
};

static_assert(sizeof(MessageHeader) == 16);
static_assert(sizeof(RegisterRequest) == 256);
static_assert(sizeof(RegisterReply) == 384);
static_assert(sizeof(Goodbye) == 64);

inline MessageHeader MakeHeader(MessageType type, uint32_t bytes) {
  return MessageHeader{kWireMagic, kWireVersion, static_cast<uint32_t>(type), bytes};
}

// Sends `bytes` of `data` with `nfds` descriptors attached to the first byte (SCM_RIGHTS).
// Returns false unless everything was sent.
inline bool SendWithFds(int sock, const void* data, size_t bytes, const int* fds, int nfds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kRegisterFds)] = {};
  if (nfds < 0 || nfds > kRegisterFds) return false;
  const char* p = static_cast<const char*>(data);
  bool first = true;
  while (bytes > 0) {
    iovec iov{const_cast<char*>(p), bytes};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (first && nfds > 0) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    first = false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `bytes` into `data`, collecting up to kRegisterFds descriptors (close-on-exec)
// into fds[] (unfilled entries are -1); *nfds receives how many came. Descriptors beyond
// kRegisterFds, or any received on failure, are closed. Returns false on EOF, error or timeout.
inline bool ReceiveWithFds(int sock, void* data, size_t bytes, int* fds, int* nfds) {
  for (int i = 0; i < kRegisterFds; ++i) fds[i] = -1;
  *nfds = 0;
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kRegisterFds + 4))] = {};
    iovec iov{p, bytes};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (*nfds < kRegisterFds) {
          fds[(*nfds)++] = fd;
        } else {
          close(fd);
        }
      }
    }
    if (n <= 0) {
      for (int i = 0; i < kRegisterFds; ++i) {
        if (fds[i] >= 0) close(fds[i]);
        fds[i] = -1;
      }
      *nfds = 0;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// A job's name (orion/job, a JobSet's or training job's name, orion-run --job): 1 to 63 of
// lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, as a
// Kubernetes name. Returns why a name is refused, or nullptr when it is valid.
inline constexpr size_t kMaxJobNameBytes = 63;
inline const char* JobNameProblem(const char* name, size_t bytes) {
  if (bytes == 0) return "is empty";
  if (bytes > kMaxJobNameBytes) return "is longer than 63 characters";
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  for (size_t i = 0; i < bytes; ++i) {
    if (!alnum(name[i]) && name[i] != '-' && name[i] != '.') {
      return "may hold only lowercase letters, digits, '-' and '.'";
    }
  }
  if (!alnum(name[0]) || !alnum(name[bytes - 1])) {
    return "must start and end with a lowercase letter or digit";
  }
  return nullptr;
}

// Environment variables read by the interposer (set by orion-run, the device plugin, or a user).
inline constexpr const char* kEnvSocket = "ORION_SOCKET";          // default below
inline constexpr const char* kEnvPriority = "ORION_PRIORITY";      // high | best-effort
inline constexpr const char* kEnvMemoryLimit = "ORION_MEMORY_LIMIT";  // e.g. 2Gi, 512Mi, bytes
inline constexpr const char* kEnvLatencyTargetMs = "ORION_LATENCY_TARGET_MS";
inline constexpr const char* kEnvJob = "ORION_JOB";  // the job of a standalone process's ranks
inline constexpr const char* kEnvDisable = "ORION_DISABLE";        // 1: pure pass-through
inline constexpr const char* kEnvQuiet = "ORION_QUIET";            // 1: no stderr notes
// A folder: with no server to register with, the interposer writes its own call logs there
// (timeline.<pid>.log, metrics.<pid>.log; format in interpose/call_log.h).
inline constexpr const char* kEnvLogDir = "ORION_LOG_DIR";
inline constexpr const char* kEnvTimingLog = "ORION_TIMING_LOG";  // folder: GPU timing diagnostic
inline constexpr const char* kEnvNvtxDepth = "ORION_NVTX_DEPTH";
// ns: a timed kernel's start latency beyond its start event's, on an idle stream and on a stream
// with work queued (interpose/sample_timing.h).
inline constexpr const char* kEnvKernelStartNs = "ORION_KERNEL_START_NS";
inline constexpr const char* kEnvQueuedStartNs = "ORION_QUEUED_START_NS";
// A file for benchmarks (bench/experiments/cpu_tax.py --in-process): its first word says what the
// process's next CUDA calls do (BenchSwitch), so one process can serve two arms in turn, block by
// block. Grants nothing a process could not do without it (it may always skip a library it
// loaded itself, or set ORION_NO_TIMING).
inline constexpr const char* kEnvBenchSwitch = "ORION_BENCH_SWITCH";
enum class BenchSwitch : uint32_t {
  kInterposed = 0,    // as usual
  kPassThrough = 1,   // straight to the driver, as with no interposer loaded
  kNoTimingHold = 2,  // interposed, timed launches never held on their stream (timing_hold.h)
  kNoTiming = 3,      // interposed, no launch timed on the GPU (ORION_NO_TIMING's arm)
  // Interposed, launches neither counted nor pushed to the event ring: what recording them
  // costs (the server then sees none of them; a diagnostic arm only).
  kNoLaunchRecords = 4,
  kNoRingPrefetch = 5,  // interposed, the ring's next entry not prefetched for writing
  // Diagnostic arms that cut a launch's path short (the server sees a client that launches
  // nothing): the launch goes to the driver once the registration is found, or once the kernel's
  // record is found and the slot's words are read (before the gate and the clock).
  kAfterRegistration = 6,
  kBeforeClock = 7,
  // Diagnostic arms that leave one part out: the launch takes its thread's first clock reading
  // instead of reading the clock (what reads the launch's time then stands still too: its busy
  // period, the launch tally's timer, the heartbeat check), or a high-priority launch publishes
  // nothing to its gate entry (busy state, kernel class, graph flag) and is not followed.
  kNoClock = 8,
  kNoHighPriorityNotes = 9,
  // A diagnostic arm: the launch takes its thread's last current context instead of asking the
  // driver (cuCtxGetCurrent) where the thread has one: what that question costs.
  kNoContextQuery = 10,
};  // any other word: as kInterposed
// ms: how long the completion poller leaves records that nobody waits for (interpose/env_config.h).
inline constexpr const char* kEnvLazyPollMs = "ORION_LAZY_POLL_MS";
// The NVTX loader (in the application) loads its tool from here: the interposer itself.
inline constexpr const char* kEnvNvtxInjection = "NVTX_INJECTION64_PATH";
// CUDA's own MPS variables, given to best-effort processes (by orion-run and the webhook) so that
// under MPS they queue behind others and use at most a share of the SMs.
inline constexpr const char* kEnvMpsClientPriority = "CUDA_MPS_CLIENT_PRIORITY";
inline constexpr const char* kEnvMpsThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
inline constexpr int kDefaultBestEffortMpsThreadPercentage = 50;
inline constexpr const char* kDefaultSocketPath = "/run/orion/orion.sock";

}  // namespace orion::contract
