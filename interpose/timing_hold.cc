// Timed launches held on their stream until their end event is recorded (timing_hold.h).
#include "interpose/glibc_compat.h"

#include "interpose/timing_hold.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>

#include "interpose/client_state.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"

namespace orion::interpose {
namespace {

constexpr size_t kPageBytes = 4096;
constexpr uint32_t kWords = kPageBytes / sizeof(uint32_t);

// The words the GPU reads (one registered page) and each word's last ticket handed out.
alignas(kPageBytes) std::atomic<uint32_t> g_words[kWords];
std::atomic<uint32_t> g_tickets[kWords];
std::atomic<uint32_t> g_threads{0};
thread_local uint32_t t_word = kWords;  // kWords: not yet chosen

// The guard: a hold still closed this long after it was queued is opened by the guard thread,
// which looks every kGuardLookNs while holds are in use. A launch call that waits for its own
// stream (a kernel's first launch loading its module, a local memory resize, a blocking launch)
// would otherwise wait for the hold forever; after kGuardOpensToStop such openings the process
// stops holding.
constexpr uint64_t kGuardOpenAfterNs = 5'000'000;
constexpr uint64_t kGuardLookNs = 10'000'000;
constexpr uint32_t kGuardOpensToStop = 3;
std::atomic<uint64_t> g_held_since[kWords];  // 0: open
std::atomic<uint32_t> g_held_ticket[kWords];
std::atomic<uint32_t> g_guard_started{0};
std::atomic<uint32_t> g_guard_opened{0};

enum : uint32_t { kUnknown = 0, kReady = 1, kUnusable = 2 };
std::atomic<uint32_t> g_page_state{kUnknown};
// Per device: the page's device address in that device's contexts (0: not known yet).
std::atomic<uint64_t> g_dptr[kMaxDevices];
std::atomic<uint32_t> g_device_state[kMaxDevices];
pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;

void NoteUnusable(const char* why) {
  if (Config().quiet) return;
  char line[200];
  const int n = snprintf(line, sizeof(line),
                         "orion: timed launches are not held on their stream: %s\n", why);
  if (n > 0) {
    ssize_t ignored = write(2, line, static_cast<size_t>(n) < sizeof(line) ? n : sizeof(line) - 1);
    (void)ignored;
  }
}

// The page's device address for `device`, registering the page once per process; 0 if the
// driver cannot map it.
uint64_t WordsOnDevice(int device) {
  const uint32_t state = g_device_state[device].load(std::memory_order_acquire);
  if (state == kReady) return g_dptr[device].load(std::memory_order_relaxed);
  if (state == kUnusable) return 0;
  pthread_mutex_lock(&g_mutex);
  const char* why = nullptr;
  if (g_page_state.load(std::memory_order_relaxed) == kUnknown) {
    auto host_register = ORION_DRIVER(cuMemHostRegister_v2);
    if (host_register == nullptr || ORION_DRIVER(cuStreamWaitValue32_v2) == nullptr ||
        ORION_DRIVER(cuMemHostGetDevicePointer_v2) == nullptr) {
      why = "the driver has no host registration or stream wait";
    } else if (const CUresult r = host_register(
                   g_words, kPageBytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
               r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
      why = "the page could not be registered with the driver";
    }
    g_page_state.store(why == nullptr ? kReady : kUnusable, std::memory_order_relaxed);
  } else if (g_page_state.load(std::memory_order_relaxed) == kUnusable) {
    why = "";  // said once already
  }
  CUdeviceptr dptr = 0;
  if (why == nullptr &&
      ORION_DRIVER(cuMemHostGetDevicePointer_v2)(&dptr, g_words, 0) != CUDA_SUCCESS) {
    why = "the page has no device address";
  }
  if (why != nullptr && why[0] != '\0') NoteUnusable(why);
  g_dptr[device].store(dptr, std::memory_order_relaxed);
  g_device_state[device].store(why == nullptr ? kReady : kUnusable, std::memory_order_release);
  pthread_mutex_unlock(&g_mutex);
  return why == nullptr ? dptr : 0;
}

// Opens `ticket` on word `w`; never moves the word back (a thread sharing it may have opened a
// later ticket).
void Open(uint32_t w, uint32_t ticket) {
  std::atomic<uint32_t>& word = g_words[w];
  uint32_t seen = word.load(std::memory_order_relaxed);
  while (static_cast<int32_t>(ticket - seen) > 0 &&
         !word.compare_exchange_weak(seen, ticket, std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
}

void* GuardMain(void*) {
  for (;;) {
    timespec ts{0, static_cast<long>(kGuardLookNs)};
    nanosleep(&ts, nullptr);
    const uint64_t now = MonotonicNs();
    const uint32_t words = std::min<uint32_t>(g_threads.load(std::memory_order_relaxed), kWords);
    for (uint32_t w = 0; w < words; ++w) {
      const uint64_t since = g_held_since[w].load(std::memory_order_acquire);
      if (since == 0 || now < since + kGuardOpenAfterNs) continue;
      Open(w, g_held_ticket[w].load(std::memory_order_relaxed));
      g_held_since[w].store(0, std::memory_order_relaxed);
      if (g_guard_opened.fetch_add(1, std::memory_order_relaxed) + 1 == kGuardOpensToStop) {
        NoteUnusable("launches waited for their own hold");
      }
    }
  }
  return nullptr;
}

void EnsureGuard() {
  if (g_guard_started.load(std::memory_order_acquire) != 0 ||
      g_guard_started.exchange(1, std::memory_order_acq_rel) != 0) {
    return;
  }
  if (!StartQuietThread(GuardMain, nullptr)) g_guard_started.store(0, std::memory_order_release);
}

}  // namespace

uint32_t HoldForTiming(int device, CUstream stream, bool per_thread_stream) {
  if (!Config().timing_hold || device < 0 || device >= kMaxDevices ||
      g_guard_opened.load(std::memory_order_relaxed) >= kGuardOpensToStop) {
    return 0;
  }
  const uint64_t base = WordsOnDevice(device);
  if (base == 0) return 0;
  EnsureGuard();
  if (g_guard_started.load(std::memory_order_relaxed) == 0) return 0;  // no guard, no hold
  if (t_word == kWords) t_word = g_threads.fetch_add(1, std::memory_order_relaxed) % kWords;
  const uint32_t w = t_word;
  uint32_t ticket = g_tickets[w].fetch_add(1, std::memory_order_relaxed) + 1;
  // The word's tickets run on through 2^32; the wait compares them modulo it (GEQ), so 0 is only
  // skipped as this file's "not held".
  if (ticket == 0) ticket = g_tickets[w].fetch_add(1, std::memory_order_relaxed) + 1;
  g_held_ticket[w].store(ticket, std::memory_order_relaxed);
  g_held_since[w].store(MonotonicNs(), std::memory_order_release);
  auto wait = per_thread_stream ? ORION_DRIVER(cuStreamWaitValue32_v2_ptsz)
                                : ORION_DRIVER(cuStreamWaitValue32_v2);
  if (wait == nullptr) wait = ORION_DRIVER(cuStreamWaitValue32_v2);
  if (wait(stream, base + w * sizeof(uint32_t), ticket, CU_STREAM_WAIT_VALUE_GEQ) !=
      CUDA_SUCCESS) {
    ReleaseTimingHold(ticket);  // nothing waits on it: keep the word level with its tickets
    return 0;
  }
  return ticket;
}

void ReleaseTimingHold(uint32_t ticket) {
  if (ticket == 0) return;
  const uint32_t w = t_word % kWords;
  g_held_since[w].store(0, std::memory_order_relaxed);
  Open(w, ticket);
}

void ResetTimingHoldAfterFork() {
  pthread_mutex_init(&g_mutex, nullptr);
  g_guard_started.store(0, std::memory_order_relaxed);  // the child has no guard thread
  for (auto& since : g_held_since) since.store(0, std::memory_order_relaxed);
  g_page_state.store(kUnknown, std::memory_order_relaxed);
  for (int d = 0; d < kMaxDevices; ++d) {
    g_dptr[d].store(0, std::memory_order_relaxed);
    g_device_state[d].store(kUnknown, std::memory_order_relaxed);
  }
}

}  // namespace orion::interpose
