// The driver side of holding best-effort work on the GPU (gpu_hold.h): the gate area's word
// registered with the driver, the stream waits queued on it, and the hold keeper, one thread per
// GPU in a best-effort process, that opens the word once the high-priority clients are idle.
#include "interpose/glibc_compat.h"

#include "interpose/gpu_hold.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "interpose/client_state.h"
#include "interpose/futex.h"
#include "interpose/real_driver.h"

namespace orion::interpose {
namespace {

// A keeper asleep on an open word looks again at least this often (a renewed registration's new
// gate area, a high-priority launch whose wake it missed).
constexpr uint64_t kKeeperIdleLookNs = 100'000'000;

enum : uint32_t { kHoldUnknown = 0, kHoldReady = 1, kHoldUnusable = 2 };

// Per device: the gate area whose word is registered, its device address, whether it can be
// used, and the registration the keeper follows (the one of the latest held launch). The held
// time: since when a launch of this process has waited behind a held gpu_hold (0: none), the
// registration it is counted to, and whether that wait is the one its counters publish.
struct DeviceHold {
  std::atomic<contract::GateArea*> gate{nullptr};
  std::atomic<uint64_t> word_dptr{0};
  std::atomic<uint32_t> state{kHoldUnknown};
  std::atomic<Registration*> keeper_reg{nullptr};
  std::atomic<uint32_t> keeper_started{0};
  std::atomic<uint64_t> held_since_ns{0};  // written under g_held_mutex
  Registration* held_reg = nullptr;
  bool held_published = false;
};
DeviceHold g_hold[kMaxDevices];
pthread_mutex_t g_hold_mutex = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_held_mutex = PTHREAD_MUTEX_INITIALIZER;  // the held time of every device

// A launch went behind a wait on gpu_hold while it was held: the process's held time starts,
// unless it runs already. Once a hold, not once a launch (the caller saw none running). Not
// where no keeper of this process runs (checked again under the lock: a keeper that failed to
// start ends what was noted, EnsureKeeper): only the keeper ends it otherwise (SettleHeldTime),
// after every open of its own and at every look, or a wait at the gate on the CPU that begins
// meanwhile (EndHeldOnGpu), which counts from then on.
void NoteHeldLaunch(DeviceHold& h, Registration* reg) {
  pthread_mutex_lock(&g_held_mutex);
  // The word read again under the lock: a keeper that opened it since then settles after this
  // (or has, and this finds it open).
  if (h.keeper_started.load(std::memory_order_acquire) != 0 &&
      h.held_since_ns.load(std::memory_order_relaxed) == 0 &&
      reg->gate->words.gpu_hold.load(std::memory_order_seq_cst) != 0) {
    const uint64_t now = MonotonicNs();
    h.held_reg = reg;
    h.held_published = contract::PublishWaitStart(reg->area->counters, now);
    h.held_since_ns.store(now, std::memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_held_mutex);
}

// When the held time ends: kIfOpen once the gpu_hold its first launch waited on is open (a word
// held anew in between, at another epoch, is one hold), or the keeper follows another
// registration now, or the server took the noted one back; kOpened(gate) as kIfOpen, and at
// once where the keeper has just opened that gate's word itself (read again, a hold taken since
// would carry the span across the open); kNow at once.
enum class SettleWhen : uint8_t { kIfOpen, kOpened, kNow };

// The held time since the first held launch goes into the throttled time of its registration,
// and onto its timeline as one held span (as a wait at the gate on the CPU, ending now).
void SettleHeldTime(DeviceHold& h, SettleWhen when = SettleWhen::kIfOpen,
                    const contract::GateArea* opened = nullptr) {
  if (h.held_since_ns.load(std::memory_order_relaxed) == 0) return;
  pthread_mutex_lock(&g_held_mutex);
  const uint64_t since = h.held_since_ns.load(std::memory_order_relaxed);
  Registration* reg = h.held_reg;
  const bool ended =
      since != 0 &&
      (when == SettleWhen::kNow || (when == SettleWhen::kOpened && reg->gate == opened) ||
       reg != h.keeper_reg.load(std::memory_order_acquire) || !reg->StillOwned() ||
       reg->gate->words.gpu_hold.load(std::memory_order_acquire) == 0);
  if (ended) {
    const uint64_t now = MonotonicNs();
    const uint64_t waited = now > since ? now - since : 0;
    contract::EndWait(reg->area->counters, waited, h.held_published);
    PushHeldSpan(reg, now, waited);
    h.held_since_ns.store(0, std::memory_order_relaxed);
    h.held_reg = nullptr;
    h.held_published = false;
  }
  pthread_mutex_unlock(&g_held_mutex);
}

void NoteUnusable(const char* why) {
  if (Config().quiet) return;
  WriteStderrLine("orion: gpu_hold: %s; best-effort launches wait at the gate instead\n", why);
}

// Registers the page of `gate` that holds the word (mapped by the GPU: a stream wait reads it
// there) and finds its device address. Once per gate area; the caller's context is current.
bool RegisterWord(DeviceHold& h, contract::GateArea* gate) {
  if (h.gate.load(std::memory_order_acquire) == gate) {
    return h.state.load(std::memory_order_acquire) == kHoldReady;
  }
  // Not while a stream of the process captures a graph: registering the page then could
  // invalidate a capture in the global mode. The launch waits at the gate on the CPU instead.
  if (g_process.open_captures.load(std::memory_order_relaxed) > 0) return false;
  pthread_mutex_lock(&g_hold_mutex);
  bool ok = h.gate.load(std::memory_order_acquire) == gate &&
            h.state.load(std::memory_order_acquire) == kHoldReady;
  if (!ok && h.gate.load(std::memory_order_acquire) != gate) {
    auto host_register = ORION_DRIVER(cuMemHostRegister_v2);
    auto device_pointer = ORION_DRIVER(cuMemHostGetDevicePointer_v2);
    const long page = sysconf(_SC_PAGESIZE);
    const uintptr_t word = reinterpret_cast<uintptr_t>(&gate->words.gpu_hold);
    void* base = reinterpret_cast<void*>(word & ~static_cast<uintptr_t>(page - 1));
    CUdeviceptr dptr = 0;
    const char* why = nullptr;
    if (host_register == nullptr || device_pointer == nullptr ||
        ORION_DRIVER(cuStreamWaitValue32_v2) == nullptr) {
      why = "the driver has no host registration or stream wait";
    } else if (const CUresult r = host_register(base, static_cast<size_t>(page),
                                                CU_MEMHOSTREGISTER_PORTABLE |
                                                    CU_MEMHOSTREGISTER_DEVICEMAP);
               r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
      why = "the gate's page could not be registered with the driver";
    } else if (device_pointer(&dptr, reinterpret_cast<void*>(word), 0) != CUDA_SUCCESS) {
      why = "the gate's page has no device address";
    }
    if (why != nullptr) NoteUnusable(why);
    h.word_dptr.store(dptr, std::memory_order_relaxed);
    h.state.store(why == nullptr ? kHoldReady : kHoldUnusable, std::memory_order_release);
    h.gate.store(gate, std::memory_order_release);
    ok = why == nullptr;
  }
  pthread_mutex_unlock(&g_hold_mutex);
  return ok;
}

// The keeper's verdict on the hold's bound (gpu_hold.h, "A hold that lasts"): the process's
// launches wait at the gate on the CPU while it is past, and for the GPU's HoldReleaseNs from
// the release at least; each release is counted and said once a process. The flag, on a line
// every launch reads, is written only when it changes.
void NoteHoldReleased(Registration& reg, bool released, uint64_t now_ns) {
  if (released == reg.HoldReleased()) return;
  if (!released) {
    if (WithinRelease(now_ns, reg.HoldReleasedNs(), HoldReleaseNs(*reg.gpu))) return;
    reg.ClearReleased();
    return;
  }
  reg.NoteReleased(now_ns);
  reg.area->counters.hold_releases.fetch_add(1, std::memory_order_relaxed);
  static std::atomic<bool> said{false};
  if (Config().quiet || said.exchange(true, std::memory_order_relaxed)) return;
  char least[64] = "";  // with no least time, the words before it
  if (const uint64_t least_ns = HoldReleaseNs(*reg.gpu); least_ns != 0) {
    snprintf(least, sizeof(least), "for %llu ms at least and ",
             static_cast<unsigned long long>(least_ns / 1'000'000));
  }
  WriteStderrLine(
      "orion: gpu_hold: the high-priority clients of GPU %d stayed busy for over %llu ms: the "
      "hold is opened, and this process's launches wait at the gate on the CPU %suntil they are "
      "idle (said once)\n",
      reg.device,
      static_cast<unsigned long long>(HoldBoundNs(*reg.gpu) / 1'000'000),
      least);
}

// The keeper's wait while a word is held (`held`: gpu_hold's epoch, `admitted`:
// gpu_hold_admitted's; 0: open), as a launch waits at the gate: counted among the gate's waiters
// (so the high-priority clients' completion trackers follow closely and wake gate_seq), asleep
// until a completion or the end of their grace. It opens what KeeperMayOpen says; it returns
// when a word changed (opened, or held anew: the caller reads them again) or both are open.
void KeepHold(DeviceHold& h, Registration* reg, uint32_t held, uint32_t admitted) {
  contract::GateArea& gate = *reg->gate;
  auto& words = gate.words;
  CountGateWaiter(gate);
  for (;;) {
    if (words.gpu_hold.load(std::memory_order_acquire) != held ||
        words.gpu_hold_admitted.load(std::memory_order_acquire) != admitted ||
        (held == 0 && admitted == 0)) {
      break;
    }
    const uint32_t seq = words.gate_seq.load(std::memory_order_acquire);
    const uint64_t now = MonotonicNs();
    uint64_t wake_by = 0;
    const bool cuts = g_process.splits_gemms.load(std::memory_order_acquire);
    const uint64_t first_cut = g_process.first_cut_ns.load(std::memory_order_relaxed);
    // (A cut after `now` was read counts as within the drain.)
    const bool draining = cuts && (first_cut >= now || now - first_cut < Config().hold_drain_ns);
    // A registration the server took back (an upgrade's new server): its area protects nobody
    // any more, and streams may still wait on its words.
    const HoldOpening open =
        reg->StillOwned() ? KeeperMayOpen(*reg->board, *reg->gpu, gate, reg->slot_index, now,
                                          &wake_by, cuts, draining)
                          : HoldOpening{true, true};
    NoteHoldReleased(*reg, open.released, now);
    // Each open tried ends a wait or meets a change that the loop's head sees.
    bool tried = false;
    if (open.admitted && admitted != 0) {
      if (OpenGpuHold(gate, admitted, HoldWord::kAdmitted)) admitted = 0;
      tried = true;
    }
    if (open.held && held != 0) {
      if (OpenGpuHold(gate, held)) {
        held = 0;
        SettleHeldTime(h, SettleWhen::kOpened, &gate);
      }
      tried = true;
    }
    if (tried) continue;
    FutexWait(&words.gate_seq, seq, GateSleepNs(now, wake_by));
  }
  UncountGateWaiter(gate);
}

void* KeeperMain(void* arg) {
  DeviceHold& h = *static_cast<DeviceHold*>(arg);
  for (;;) {
    Registration* reg = h.keeper_reg.load(std::memory_order_acquire);
    if (reg == nullptr) {
      FutexWaitPrivate(&h.keeper_started, 1, kKeeperIdleLookNs);
      continue;
    }
    contract::GateArea& gate = *reg->gate;
    const uint32_t held = gate.words.gpu_hold.load(std::memory_order_acquire);
    const uint32_t admitted = gate.words.gpu_hold_admitted.load(std::memory_order_acquire);
    SettleHeldTime(h);  // the word seen open, by whichever keeper opened it
    if (!reg->StillOwned()) {  // opened (KeepHold), then wait for a launch on the new one
      if (held != 0 || admitted != 0) KeepHold(h, reg, held, admitted);
      FutexWaitPrivate(&h.keeper_started, 1, kKeeperIdleLookNs);
      continue;
    }
    if (held != 0 || admitted != 0) {
      KeepHold(h, reg, held, admitted);
      continue;
    }
    gate.words.hold_sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (gate.words.gpu_hold.load(std::memory_order_seq_cst) == 0) {
      FutexWait(&gate.words.gpu_hold, 0, kKeeperIdleLookNs);
    }
    gate.words.hold_sleepers.fetch_sub(1, std::memory_order_acq_rel);
  }
  return nullptr;
}

void EnsureKeeper(DeviceHold& h, Registration* reg) {
  if (h.keeper_reg.load(std::memory_order_relaxed) != reg) {
    h.keeper_reg.store(reg, std::memory_order_release);
  }
  if (h.keeper_started.load(std::memory_order_acquire) != 0 ||
      h.keeper_started.exchange(1, std::memory_order_acq_rel) != 0) {
    return;
  }
  if (!StartQuietThread(KeeperMain, &h)) {
    h.keeper_started.store(0, std::memory_order_release);
    SettleHeldTime(h, SettleWhen::kNow);  // noted meanwhile: nobody would end it
  }
}

}  // namespace

bool QueueHoldWait(Registration* reg, CUstream stream, bool per_thread_stream, HoldWord which) {
  if (reg->device < 0 || reg->device >= kMaxDevices) return false;
  DeviceHold& h = g_hold[reg->device];
  if (!RegisterWord(h, reg->gate)) return false;  // a gate that cannot hold answers at once
  EnsureKeeper(h, reg);
  auto wait = per_thread_stream ? ORION_DRIVER(cuStreamWaitValue32_v2_ptsz)
                                : ORION_DRIVER(cuStreamWaitValue32_v2);
  if (wait == nullptr) wait = ORION_DRIVER(cuStreamWaitValue32_v2);
  // Both words lie in the registered page, at their offsets from gpu_hold.
  contract::GateArea& gate = *reg->gate;
  const uint64_t offset = reinterpret_cast<uintptr_t>(&HoldWordOf(gate, which)) -
                          reinterpret_cast<uintptr_t>(&gate.words.gpu_hold);
  if (wait(stream, h.word_dptr.load(std::memory_order_relaxed) + offset, 0,
           CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS) {
    return false;
  }
  // Held time: what waits on gpu_hold while it is held (a launch the gate on the CPU admitted
  // counts there, at the gate). The process's own start first: while a hold is counted, no
  // load of the shared line.
  if (which == HoldWord::kHeld && h.held_since_ns.load(std::memory_order_relaxed) == 0 &&
      gate.words.gpu_hold.load(std::memory_order_relaxed) != 0) {
    NoteHeldLaunch(h, reg);
  }
  return true;
}

void EndHeldOnGpu(const Registration* reg) {
  if (reg->device >= 0 && reg->device < kMaxDevices) {
    SettleHeldTime(g_hold[reg->device], SettleWhen::kNow);
  }
}

void WakeHoldKeepers(contract::GateArea& gate) {
  if (gate.words.hold_sleepers.load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&gate.words.gpu_hold);
  }
}

void ResetHoldAfterFork() {
  pthread_mutex_init(&g_hold_mutex, nullptr);
  pthread_mutex_init(&g_held_mutex, nullptr);
  for (DeviceHold& h : g_hold) {  // nothing of the parent's is ours: register anew if used
    h.gate.store(nullptr, std::memory_order_relaxed);
    h.word_dptr.store(0, std::memory_order_relaxed);
    h.state.store(kHoldUnknown, std::memory_order_relaxed);
    h.keeper_started.store(0, std::memory_order_relaxed);
    h.keeper_reg.store(nullptr, std::memory_order_relaxed);
    h.held_since_ns.store(0, std::memory_order_relaxed);  // the parent's wait, not ours
    h.held_reg = nullptr;
    h.held_published = false;
  }
}

}  // namespace orion::interpose
