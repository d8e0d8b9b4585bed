// GPU time to host time through anchor events (see gpu_clock.h).
#include "interpose/glibc_compat.h"

#include "interpose/gpu_clock.h"

#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"

namespace orion::interpose {

GpuClock::Context* GpuClock::Find(CUcontext ctx) {
  Context* empty = nullptr;
  for (Context& c : contexts_) {
    if (c.ctx == ctx) return &c;
    if (c.ctx == nullptr && empty == nullptr) empty = &c;
  }
  if (empty == nullptr) return nullptr;  // more contexts than slots: no host times there
  *empty = Context{};
  empty->ctx = ctx;
  auto create_stream = ORION_DRIVER(cuStreamCreate);
  if (create_stream == nullptr || create_stream(&empty->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    empty->failed = true;
  }
  return empty;
}

bool GpuClock::Renew(Context& c) {
  auto create = ORION_DRIVER(cuEventCreate);
  auto record = ORION_DRIVER(cuEventRecord);
  auto sync = ORION_DRIVER(cuEventSynchronize);
  auto elapsed = ORION_DRIVER(cuEventElapsedTime_v2);
  if (create == nullptr || record == nullptr || sync == nullptr || elapsed == nullptr) return false;
  CUevent event = c.spare;
  if (event == nullptr && create(&event, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return false;
  c.spare = nullptr;
  if (record(event, c.stream) != CUDA_SUCCESS) {
    c.spare = event;
    return false;
  }
  // The event ran between the record call's return and the first query that finds it done:
  // polled for at most kSpinNs (microseconds on an idle stream), the middle of the two is its
  // time when that is precise. Past that (a GPU busy with other contexts) it is waited for, and
  // the chain from the previous anchor places it below.
  const uint64_t recorded_ns = MonotonicNs();
  uint64_t seen_ns = 0;
  auto query = ORION_DRIVER(cuEventQuery);
  while (query != nullptr) {
    const CUresult r = query(event);
    const uint64_t now = MonotonicNs();
    if (r == CUDA_SUCCESS) {
      seen_ns = now;
      break;
    }
    if (r != CUDA_ERROR_NOT_READY || now - recorded_ns > kSpinNs) break;
  }
  if (seen_ns == 0 && sync(event) != CUDA_SUCCESS) {
    c.spare = event;
    return false;
  }
  const bool precise = seen_ns != 0 && seen_ns - recorded_ns <= kPreciseNs;
  uint64_t host_ns = seen_ns != 0 ? recorded_ns + (seen_ns - recorded_ns) / 2 : recorded_ns;
  float ms = 0.0f;
  double chained = 0;
  if (c.current.event != nullptr && elapsed(&ms, c.current.event, event) == CUDA_SUCCESS) {
    const double gpu_gap_ns = static_cast<double>(ms) * 1e6;
    chained = static_cast<double>(c.current.host_ns) + gpu_gap_ns * c.rate;
    if (precise && c.current.precise) {
      if (NextRate(&c.rate, c.rate_known,
                   static_cast<double>(host_ns) - static_cast<double>(c.current.host_ns),
                   gpu_gap_ns)) {
        c.rate_known = true;
      }
    } else if (!precise) {
      // Waited for: the chain, which cannot be before the record call.
      host_ns = chained > static_cast<double>(recorded_ns) ? static_cast<uint64_t>(chained)
                                                           : recorded_ns;
    }
  }
  if (renewals_.count < kMaxRenewals) {
    renewals_.items[renewals_.count++] =
        Renewal{reinterpret_cast<uint64_t>(c.ctx), recorded_ns, seen_ns,
                chained > 0 ? static_cast<uint64_t>(chained) : 0, host_ns, c.rate};
  }
  c.spare = c.previous.event;
  c.previous = c.current;
  c.current = Anchor{event, host_ns, precise};
  c.renewed_ns = recorded_ns;
  return true;
}

bool GpuClock::ToHost(CUcontext ctx, CUevent event, uint64_t* host_ns) {
  Context* c = Find(ctx);
  if (c == nullptr || c->failed) return false;
  const uint64_t now = MonotonicNs();
  if (c->current.event == nullptr || now - c->renewed_ns > kRenewNs) {
    if (!Renew(*c)) {
      // The context was destroyed (its address may come back as a new one): start afresh.
      *c = Context{};
      return false;
    }
  }
  auto elapsed = ORION_DRIVER(cuEventElapsedTime_v2);
  float ms = 0.0f;
  for (const Anchor* a : {&c->current, &c->previous}) {
    // Events recorded before the newest anchor are placed from the one before it (the
    // difference is then positive and small).
    if (a->event == nullptr || elapsed(&ms, a->event, event) != CUDA_SUCCESS) continue;
    if (ms < 0.0f && a == &c->current && c->previous.event != nullptr) continue;
    const double t = static_cast<double>(a->host_ns) + static_cast<double>(ms) * 1e6 * c->rate;
    if (t <= 0.0) return false;
    *host_ns = static_cast<uint64_t>(t);
    return true;
  }
  return false;
}

void GpuClock::Reset() {
  for (Context& c : contexts_) c = Context{};
  ForgetRenewals();
}

}  // namespace orion::interpose
