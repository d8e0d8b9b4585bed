// The futex calls of the launch gate and the completion poller, in one place. Shared futexes
// (the gate's words: a MAP_SHARED mapping whose waiters and wakers are different processes) and
// private ones (the poller's own words, within this process). Timeouts are relative, in ns.
#pragma once

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace orion::interpose {

inline constexpr uint64_t kNoFutexTimeout = UINT64_MAX;

namespace futex_detail {
inline void Wait(const std::atomic<uint32_t>* word, int op, uint32_t expected,
                 uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000ull),
              static_cast<long>(timeout_ns % 1'000'000'000ull)};
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), op, expected,
          timeout_ns == kNoFutexTimeout ? nullptr : &ts, nullptr, 0);
}
inline void Wake(std::atomic<uint32_t>* word, int op, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, count, nullptr, nullptr, 0);
}
}  // namespace futex_detail

// Sleeps while *word == expected, up to timeout_ns (another process may wake it).
inline void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) {
  futex_detail::Wait(word, FUTEX_WAIT, expected, timeout_ns);
}
// Wakes every waiter of *word, in any process.
inline void FutexWakeAll(std::atomic<uint32_t>* word) {
  futex_detail::Wake(word, FUTEX_WAKE, 0x7fffffff);
}
// The same within this process only; kNoFutexTimeout waits without a timeout.
inline void FutexWaitPrivate(const std::atomic<uint32_t>* word, uint32_t expected,
                             uint64_t timeout_ns) {
  futex_detail::Wait(word, FUTEX_WAIT_PRIVATE, expected, timeout_ns);
}
inline void FutexWakeOnePrivate(std::atomic<uint32_t>* word) {
  futex_detail::Wake(word, FUTEX_WAKE_PRIVATE, 1);
}

}  // namespace orion::interpose
