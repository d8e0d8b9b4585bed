// What a thread's launches keep between them, in one 64-byte line of initial-exec TLS reached
// through one GOT entry: the thread's cached registration (client_state.cc), its launch tally
// (client_state.h, CountLaunch) and its last launch stream (nvtx_ranges.h). A steady launch
// reads or writes all three; as three thread-locals they took three lines and three GOT entries.
#pragma once

#include <stdint.h>

#include "interpose/cuda_abi.h"

namespace orion::interpose {

struct Registration;

// The thread's last launch stream, written on every launch (NoteLaunchStream).
struct ThreadStream {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  bool per_thread_stream = false;
  bool has_stream = false;
  uint32_t waiting = 0;  // tracked ranges with wants_start
};

struct alignas(64) ThreadLaunch {
  // CurrentRegistration's cache: the thread's last context, its registration, and the process's
  // epoch when it was found (ProcessState::epoch).
  CUcontext ctx = nullptr;
  Registration* reg = nullptr;
  uint32_t epoch = 0;
  // CountLaunch: kernels launched and not yet added to tally_reg's counter, and when this thread
  // last added to it.
  uint32_t tally_kernels = 0;
  Registration* tally_reg = nullptr;
  uint64_t tally_added_ns = 0;
  ThreadStream stream;
};
static_assert(sizeof(ThreadLaunch) == 64, "one cache line");

__attribute__((visibility("hidden"))) extern constinit thread_local ThreadLaunch t_launch
    __attribute__((tls_model("initial-exec")));

}  // namespace orion::interpose
