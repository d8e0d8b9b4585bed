// The NVTX tool side of the interposer (see nvtx_ranges.h): InitializeInjectionNvtx2, the range
// callbacks it installs, the per-thread stacks of open ranges and the kRange events they become.
#include "interpose/glibc_compat.h"

#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <stdint.h>
#include <wchar.h>

#include <atomic>

#include "interpose/call_log.h"
#include "interpose/client_state.h"
#include "interpose/completion_tracker.h"
#include "interpose/launch_gate.h"
#include "interpose/nvtx_ranges.h"

namespace orion::interpose {

namespace {

constexpr uint32_t kMaxTracked = 8;     // push/pop levels with state; deeper ones only counted
constexpr uint32_t kStartedRanges = 64; // nvtxRangeStart ranges open at once, process-wide

// Every member has a constant initialiser: the objects below are constant-initialised (no
// constructor at load, no TLS initialiser on the launch path).
struct OpenRange {
  PendingLaunch* record = nullptr;  // start event recorded; null: CPU times only (so far)
  uint64_t cpu_start_ns = 0;
  bool reported = false;            // nested less than ORION_NVTX_DEPTH deep
  bool wants_start = false;         // the thread had no stream yet: start at its next launch
  char name[contract::kKernelNameBytes] = {};
};

struct ThreadRanges {
  uint32_t depth = 0;    // open push/pop ranges, tracked or not
  OpenRange open[kMaxTracked] = {};
};
constinit thread_local ThreadRanges t_ranges;

// nvtxRangeStart/End ranges may end on another thread: a small process-wide table.
struct StartedRange {
  std::atomic<uint32_t> state{0};  // kFree, kBusy (being filled or closed), kOpen
  uint32_t generation = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  bool per_thread_stream = false;
  OpenRange range;
};
enum : uint32_t { kFree = 0, kBusy = 1, kOpen = 2 };
constinit StartedRange g_started[kStartedRanges];

// The range's name from NVTX's attribute structure (ASCII or wide; registered strings, which
// belong to the domain API this tool does not take, read as "range").
void NameFrom(const nvtxEventAttributes_t* a, char* out, size_t out_bytes) {
  const size_t need = offsetof(nvtxEventAttributes_t, message) + sizeof(a->message);
  const char* fallback = "range";
  if (a == nullptr || a->size < need) {
    CopyTruncated(out, out_bytes, fallback);
  } else if (a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii != nullptr) {
    CopyTruncated(out, out_bytes, a->message.ascii);
  } else if (a->messageType == NVTX_MESSAGE_TYPE_UNICODE && a->message.unicode != nullptr) {
    size_t i = 0;  // ASCII characters kept, others as '?'
    for (; i + 1 < out_bytes && a->message.unicode[i] != L'\0'; ++i) {
      const wchar_t c = a->message.unicode[i];
      out[i] = (c > 0 && c < 0x80) ? static_cast<char>(c) : '?';
    }
    out[i] = '\0';
  } else {
    CopyTruncated(out, out_bytes, fallback);
  }
}

void WideName(const wchar_t* w, char* out, size_t out_bytes) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  a.message.unicode = w;
  NameFrom(&a, out, out_bytes);
}

// Records the range's GPU start on `stream` (the thread's last one).
void StartOnGpu(OpenRange& r, CUcontext ctx, CUstream stream, bool per_thread_stream) {
  PendingLaunch* p = AcquirePending(ctx, /*timed=*/true);
  if (p == nullptr) return;
  if (RecordStart(p, stream, per_thread_stream)) {
    r.record = p;
  } else {
    ReleasePending(p);
  }
}

// Opens `r` now under `name`. Its GPU start is recorded on the thread's last stream; a push/pop
// range of a thread that has launched nothing yet (`start_at_next_launch`) gets it at the
// thread's next launch instead, a start/end range (which may end on another thread) none.
void Open(OpenRange& r, const char* name, bool start_at_next_launch) {
  CopyTruncated(r.name, sizeof(r.name), name != nullptr ? name : "range");
  r.record = nullptr;
  r.cpu_start_ns = MonotonicNs();
  ThreadStream& ts = t_launch.stream;
  r.wants_start = start_at_next_launch && !ts.has_stream;
  if (r.wants_start) {
    ++ts.waiting;
  } else if (ts.has_stream) {
    StartOnGpu(r, ts.ctx, ts.stream, ts.per_thread_stream);
  }
}

// Reports a closed range: to the server (GPU end recorded on `stream`, the poller places both
// ends on the host clock), to the call log without a server, or nowhere.
void Close(OpenRange& r, uint32_t depth, CUstream stream, bool per_thread_stream) {
  const uint64_t now = MonotonicNs();
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  PendingLaunch* p = r.record;
  r.record = nullptr;
  if (reg == nullptr) {
    if (p != nullptr) ReleasePending(p);
    if (CallLogActive()) {
      LogCall("nvtxRange", r.name, RealtimeNs() - (now - r.cpu_start_ns), now - r.cpu_start_ns,
              0, contract::CopyDirection::kUnknown, /*is_copy=*/false);
    }
    return;
  }
  if (p == nullptr) {
    ReportRange(reg, r.name, depth, r.cpu_start_ns, now, 0, 0, 0);
    return;
  }
  p->reg = reg;
  p->range = true;
  p->depth = depth;
  p->cpu_start_ns = r.cpu_start_ns;
  p->cpu_end_ns = now;
  p->stream = reinterpret_cast<uint64_t>(stream);
  CopyTruncated(p->name, sizeof(p->name), r.name);
  SubmitPending(p, stream, per_thread_stream, now);  // a failed record reports CPU times only
}

int Push(const char* name) {
  ThreadRanges& t = t_ranges;
  const uint32_t level = t.depth++;
  if (level >= kMaxTracked) return static_cast<int>(level);
  OpenRange& r = t.open[level];
  r.reported = level < Config().nvtx_depth;
  if (r.reported) Open(r, name, /*start_at_next_launch=*/true);
  return static_cast<int>(level);
}

int NVTX_API Pop() {
  ThreadRanges& t = t_ranges;
  if (t.depth == 0) return -1;  // unbalanced pop: NVTX's own error value
  const uint32_t level = --t.depth;
  if (level >= kMaxTracked || !t.open[level].reported) return static_cast<int>(level);
  OpenRange& r = t.open[level];
  r.reported = false;
  ThreadStream& ts = t_launch.stream;
  if (r.wants_start) {
    r.wants_start = false;
    --ts.waiting;
  }
  Close(r, level, ts.stream, ts.per_thread_stream);
  return static_cast<int>(level);
}

// Ids are (generation << 8 | index) + 1; 0 is NVTX's "no range".
nvtxRangeId_t Start(const char* name) {
  if (Config().nvtx_depth == 0) return 0;
  const ThreadStream& ts = t_launch.stream;
  for (uint32_t i = 0; i < kStartedRanges; ++i) {
    StartedRange& s = g_started[i];
    uint32_t expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kBusy, std::memory_order_acquire)) continue;
    s.ctx = ts.ctx;
    s.stream = ts.stream;
    s.per_thread_stream = ts.per_thread_stream;
    Open(s.range, name, /*start_at_next_launch=*/false);
    const uint32_t generation = s.generation;
    s.state.store(kOpen, std::memory_order_release);
    return ((static_cast<uint64_t>(generation) << 8) | i) + 1;
  }
  return 0;  // more open at once than the table holds: not reported
}

// The three spellings of an NVTX call that opens a range (ASCII, wide, event attributes) over
// the one implementation, which takes the name.
template <typename Result, Result (*Begin)(const char*)>
struct Spellings {
  static Result NVTX_API Ascii(const char* message) { return Begin(message); }
  static Result NVTX_API Wide(const wchar_t* message) {
    char name[contract::kKernelNameBytes];
    WideName(message, name, sizeof(name));
    return Begin(name);
  }
  static Result NVTX_API Attributes(const nvtxEventAttributes_t* attributes) {
    char name[contract::kKernelNameBytes];
    NameFrom(attributes, name, sizeof(name));
    return Begin(name);
  }
};
using PushCalls = Spellings<int, &Push>;
using StartCalls = Spellings<nvtxRangeId_t, &Start>;

void NVTX_API End(nvtxRangeId_t id) {
  if (id == 0) return;
  const uint64_t index = (id - 1) & 0xFF;
  if (index >= kStartedRanges) return;
  StartedRange& s = g_started[index];
  uint32_t expected = kOpen;
  if (s.generation != static_cast<uint32_t>((id - 1) >> 8) ||
      !s.state.compare_exchange_strong(expected, kBusy, std::memory_order_acquire)) {
    return;  // already ended, or not ours
  }
  // The end goes on the ending thread's stream when it belongs to the range's context.
  const ThreadStream& ts = t_launch.stream;
  const bool own = ts.has_stream && ts.ctx == s.ctx;
  Close(s.range, 0, own ? ts.stream : s.stream, own ? ts.per_thread_stream : s.per_thread_stream);
  ++s.generation;
  s.state.store(kFree, std::memory_order_release);
}

}  // namespace

void ReportRange(Registration* reg, const char* name, uint32_t depth, uint64_t cpu_start_ns,
                 uint64_t cpu_end_ns, uint64_t gpu_start_ns, uint64_t gpu_end_ns, uint64_t stream) {
  contract::Event e{};
  e.kind = contract::EventKind::kRange;
  e.aux = depth;
  e.cpu_ns = cpu_start_ns;
  e.duration_ns = cpu_end_ns >= cpu_start_ns ? cpu_end_ns - cpu_start_ns : 0;
  if (gpu_start_ns != 0) {
    e.flags = contract::kOnHostClock;
    e.func = gpu_start_ns;
    e.bytes = gpu_end_ns;
  }
  e.stream = stream;
  CopyTruncated(e.name, sizeof(e.name), name);
  PushEvent(reg, e);
}

void StartWaitingRanges(CUcontext ctx, CUstream stream, bool per_thread_stream) {
  ThreadStream& ts = t_launch.stream;
  ThreadRanges& t = t_ranges;
  const uint32_t tracked = t.depth < kMaxTracked ? t.depth : kMaxTracked;
  for (uint32_t i = 0; i < tracked; ++i) {
    OpenRange& r = t.open[i];
    if (!r.reported || !r.wants_start) continue;
    r.wants_start = false;
    StartOnGpu(r, ctx, stream, per_thread_stream);
  }
  ts.waiting = 0;
}

void ResetNvtxAfterFork() {
  ThreadRanges& t = t_ranges;
  for (OpenRange& r : t.open) r.record = nullptr;
  t_launch.stream.has_stream = false;  // the parent's streams do not exist in the child
  for (StartedRange& s : g_started) {
    s.range.record = nullptr;
    s.state.store(kFree, std::memory_order_relaxed);
  }
}

}  // namespace orion::interpose

// The NVTX loader's entry point into its tool. Returns 1 when the range calls were installed.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  using namespace orion::interpose;
  if (get_export_table == nullptr || !EnsureProcessInit() || Config().nvtx_depth == 0) return 0;
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(NvtxExportTableCallbacks) ||
      callbacks->GetModuleFunctionTable == nullptr) {
    return 0;
  }
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) == 0 ||
      table == nullptr) {
    return 0;
  }
  auto install = [&](unsigned int id, auto fn) {
    if (id < size && table[id] != nullptr) {
      *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
    }
  };
  install(NVTX_CBID_CORE_RangePushA, &PushCalls::Ascii);
  install(NVTX_CBID_CORE_RangePushW, &PushCalls::Wide);
  install(NVTX_CBID_CORE_RangePushEx, &PushCalls::Attributes);
  install(NVTX_CBID_CORE_RangePop, &Pop);
  install(NVTX_CBID_CORE_RangeStartA, &StartCalls::Ascii);
  install(NVTX_CBID_CORE_RangeStartW, &StartCalls::Wide);
  install(NVTX_CBID_CORE_RangeStartEx, &StartCalls::Attributes);
  install(NVTX_CBID_CORE_RangeEnd, &End);
  return 1;
}
