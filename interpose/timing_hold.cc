// Timed launches held on their stream until their end event is recorded (timing_hold.h).
#include "interpose/glibc_compat.h"

#include "interpose/timing_hold.h"

#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

#include <atomic>

#include "interpose/client_state.h"
#include "interpose/futex.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"

namespace orion::interpose {
namespace {

constexpr size_t kPageBytes = 4096;
constexpr uint32_t kWords = kPageBytes / sizeof(uint32_t);
constexpr uint32_t kNoWord = UINT32_MAX;
constexpr uint32_t kGivenBack = UINT32_MAX - 1;  // the thread is exiting: no more holds

// The words the GPU reads: one page of the process, mapped here (not forked: a child starts
// with none and maps its own) and registered with the driver. Null until the first hold.
std::atomic<std::atomic<uint32_t>*> g_page{nullptr};
// Each word's last ticket handed out, and who owns it: a thread claims a word at its first
// hold and gives it back when it exits, so no two threads share one. No word left: no hold.
std::atomic<uint32_t> g_tickets[kWords];
std::atomic<uint64_t> g_claimed[kWords / 64];
pthread_key_t g_word_key;
pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
constinit thread_local uint32_t t_word ORION_INITIAL_EXEC_TLS = kNoWord;

// The guard: a hold still closed kGuardOpenAfterNs after it was queued is opened by the guard
// thread, which looks every kGuardLookNs while holds are taken and sleeps after
// kGuardIdlePasses looks that found none. A launch call that waits for its own stream (a
// kernel's first launch on a GPU loading its module, a local memory resize) would otherwise
// wait for the hold forever; after kGuardOpensToStop such openings the process stops holding
// (the guard stays, and opens whatever is still outstanding at once). A thread preempted for
// 5 ms inside its hold counts too.
constexpr uint32_t kGuardOpenAfterUs = 5'000;
constexpr uint64_t kGuardLookNs = 20'000'000;
constexpr uint32_t kGuardIdlePasses = 10;
constexpr uint32_t kGuardOpensToStop = 3;
// Per word, the hold outstanding: its ticket (low 32 bits) and when it was queued in
// microseconds of the monotonic clock (high 32 bits, compared modulo 2^32); 0 when open. The
// guard and the owner each clear it with a compare-and-swap from the value they saw, so neither
// clears the other's next hold.
std::atomic<uint64_t> g_outstanding[kWords];
std::atomic<uint32_t> g_guard_started{0};
std::atomic<uint32_t> g_guard_opened{0};
// Futex word: 1 while the guard sleeps. It raises it, then looks at every hold (seq_cst); a
// hold stores its record, then reads it (seq_cst): either the guard sees the hold or the hold
// sees the guard asleep and wakes it.
std::atomic<uint32_t> g_guard_parked{0};

pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;

void Note(const char* why) {
  if (Config().quiet) return;
  WriteStderrLine("orion: timed launches are not held on their stream: %s\n", why);
}

bool Stopped() { return g_guard_opened.load(std::memory_order_relaxed) >= kGuardOpensToStop; }

void GiveBackWord(void* value) {
  const uint32_t w = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(value)) - 1;
  t_word = kGivenBack;  // a launch from a later key destructor must not use it
  if (w < kWords) g_claimed[w / 64].fetch_and(~(1ull << (w % 64)), std::memory_order_release);
}

void MakeKey() {
  if (pthread_key_create(&g_word_key, GiveBackWord) != 0) g_word_key = static_cast<pthread_key_t>(-1);
}

// This thread's word, claimed at its first hold; kNoWord when all are taken.
uint32_t OwnWord() {
  if (t_word == kGivenBack) return kNoWord;
  if (t_word != kNoWord) return t_word;
  pthread_once(&g_key_once, MakeKey);
  if (g_word_key == static_cast<pthread_key_t>(-1)) return kNoWord;
  for (uint32_t block = 0; block < kWords / 64; ++block) {
    uint64_t seen = g_claimed[block].load(std::memory_order_relaxed);
    while (seen != ~0ull) {
      const int bit = __builtin_ctzll(~seen);
      if (g_claimed[block].compare_exchange_weak(seen, seen | (1ull << bit),
                                                 std::memory_order_acquire)) {
        t_word = block * 64 + static_cast<uint32_t>(bit);
        pthread_setspecific(g_word_key, reinterpret_cast<void*>(uintptr_t{t_word} + 1));
        return t_word;
      }
    }
  }
  return kNoWord;
}

// Opens `ticket` on word `w`; never moves the word back.
void Open(std::atomic<uint32_t>* page, uint32_t w, uint32_t ticket) {
  std::atomic<uint32_t>& word = page[w];
  uint32_t seen = word.load(std::memory_order_relaxed);
  while (static_cast<int32_t>(ticket - seen) > 0 &&
         !word.compare_exchange_weak(seen, ticket, std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
}

// One look at every hold: opens those older than kGuardOpenAfterUs (all of them once holding
// has stopped). True if any was outstanding.
bool GuardPass(std::atomic<uint32_t>* page) {
  const uint32_t now_us = static_cast<uint32_t>(MonotonicNs() / 1000);
  bool any = false;
  for (uint32_t w = 0; w < kWords; ++w) {
    uint64_t seen = g_outstanding[w].load(std::memory_order_seq_cst);
    if (seen == 0) continue;
    any = true;
    const uint32_t since_us = static_cast<uint32_t>(seen >> 32);
    // Signed: a hold queued after now_us was read is young, not 71 minutes old.
    if (static_cast<int32_t>(now_us - since_us) < static_cast<int32_t>(kGuardOpenAfterUs) &&
        !Stopped()) {
      continue;
    }
    if (page == nullptr ||
        !g_outstanding[w].compare_exchange_strong(seen, 0, std::memory_order_acq_rel)) {
      continue;
    }
    Open(page, w, static_cast<uint32_t>(seen));
    if (g_guard_opened.fetch_add(1, std::memory_order_relaxed) + 1 == kGuardOpensToStop) {
      Note("launches waited for their own hold");
    }
  }
  return any;
}

void* GuardMain(void*) {
  uint32_t idle_passes = 0;
  for (;;) {
    timespec ts{0, static_cast<long>(kGuardLookNs)};
    nanosleep(&ts, nullptr);
    std::atomic<uint32_t>* page = g_page.load(std::memory_order_acquire);
    if (GuardPass(page)) {
      idle_passes = 0;
      continue;
    }
    if (++idle_passes < kGuardIdlePasses) continue;
    // Nothing held for a while: sleep until a hold wakes us. Raised first, then every hold
    // looked at again, so a hold queued meanwhile is either seen here or wakes us.
    g_guard_parked.store(1, std::memory_order_seq_cst);
    if (!GuardPass(g_page.load(std::memory_order_acquire))) {
      FutexWaitPrivate(&g_guard_parked, 1, kNoFutexTimeout);
    }
    g_guard_parked.store(0, std::memory_order_relaxed);
    idle_passes = 0;
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

// The page, mapped on first use; null if it cannot be.
std::atomic<uint32_t>* Page() {
  std::atomic<uint32_t>* page = g_page.load(std::memory_order_acquire);
  if (page != nullptr) return page;
  pthread_mutex_lock(&g_mutex);
  page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) {
    void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      madvise(p, kPageBytes, MADV_DONTFORK);  // a fork child must not write a copy of it
      page = static_cast<std::atomic<uint32_t>*>(p);
      g_page.store(page, std::memory_order_release);
    }
  }
  pthread_mutex_unlock(&g_mutex);
  return page;
}

// The page's device address in the current context, registering the page with the driver
// where it is not (a first use, or a context reset since, which drops host registrations); 0
// if the driver cannot map it. One lookup a held launch: registrations die with contexts.
uint64_t DeviceAddress(std::atomic<uint32_t>* page) {
  auto device_pointer = ORION_DRIVER(cuMemHostGetDevicePointer_v2);
  auto host_register = ORION_DRIVER(cuMemHostRegister_v2);
  if (device_pointer == nullptr || host_register == nullptr ||
      ORION_DRIVER(cuStreamWaitValue32_v2) == nullptr) {
    return 0;
  }
  CUdeviceptr dptr = 0;
  if (device_pointer(&dptr, page, 0) == CUDA_SUCCESS) return dptr;
  const CUresult r = host_register(page, kPageBytes,
                                   CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if ((r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) ||
      device_pointer(&dptr, page, 0) != CUDA_SUCCESS) {
    static std::atomic<uint32_t> said{0};
    if (said.exchange(1, std::memory_order_relaxed) == 0) {
      Note("the driver cannot map a page of the process for a stream wait");
    }
    return 0;
  }
  return dptr;
}

}  // namespace

uint32_t HoldForTiming(CUstream stream, bool per_thread_stream) {
  if (!Config().timing_hold || Stopped()) return 0;
  std::atomic<uint32_t>* page = Page();
  const uint32_t w = OwnWord();
  if (page == nullptr || w == kNoWord) return 0;
  const uint64_t base = DeviceAddress(page);
  if (base == 0) return 0;
  EnsureGuard();
  if (g_guard_started.load(std::memory_order_relaxed) == 0) return 0;  // no guard, no hold
  uint32_t ticket = g_tickets[w].fetch_add(1, std::memory_order_relaxed) + 1;
  // The word's tickets run on through 2^32; the wait compares them modulo it (GEQ), so 0 is only
  // skipped as this file's "not held".
  if (ticket == 0) ticket = g_tickets[w].fetch_add(1, std::memory_order_relaxed) + 1;
  const uint32_t now_us = static_cast<uint32_t>(MonotonicNs() / 1000);
  g_outstanding[w].store((static_cast<uint64_t>(now_us) << 32) | ticket, std::memory_order_seq_cst);
  if (g_guard_parked.load(std::memory_order_seq_cst) != 0) {
    g_guard_parked.store(0, std::memory_order_relaxed);
    FutexWakeOnePrivate(&g_guard_parked);
  }
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

void OpenTimingHold(uint32_t ticket) {
  if (t_word >= kWords) return;
  std::atomic<uint32_t>* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return;
  const uint32_t w = t_word;
  // Clears the record of this hold unless the guard opened it already.
  uint64_t seen = g_outstanding[w].load(std::memory_order_relaxed);
  if (static_cast<uint32_t>(seen) == ticket) {
    g_outstanding[w].compare_exchange_strong(seen, 0, std::memory_order_acq_rel);
  }
  Open(page, w, ticket);
}

void ResetTimingHoldAfterFork() {
  // The child has no copy of the page (MADV_DONTFORK: it maps a new one, all 0), no guard
  // thread and one thread, which keeps its word; tickets start again with the page.
  pthread_mutex_init(&g_mutex, nullptr);
  g_page.store(nullptr, std::memory_order_relaxed);
  g_guard_started.store(0, std::memory_order_relaxed);
  g_guard_parked.store(0, std::memory_order_relaxed);
  for (auto& outstanding : g_outstanding) outstanding.store(0, std::memory_order_relaxed);
  for (auto& tickets : g_tickets) tickets.store(0, std::memory_order_relaxed);
  for (auto& claimed : g_claimed) claimed.store(0, std::memory_order_relaxed);
  if (t_word < kWords) g_claimed[t_word / 64].store(1ull << (t_word % 64), std::memory_order_relaxed);
}

}  // namespace orion::interpose
