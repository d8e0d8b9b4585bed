// Finishing a completion record (completion_report.h): the gate's bookkeeping, then the timed
// sample or the NVTX range.
#include "interpose/glibc_compat.h"

#include "interpose/completion_report.h"

#include "interpose/client_state.h"
#include "interpose/launch_gate.h"
#include "interpose/nvtx_ranges.h"
#include "interpose/timed_samples.h"

namespace orion::interpose {

void FinishRecord(PendingLaunch* p, bool measured_on_gpu) {
  Registration* reg = p->reg;
  if (p->range) {
    uint64_t start = 0, end = 0;
    if (!measured_on_gpu || !PlaceOnHostClock(*p, &start, &end)) start = end = 0;
    if (reg != nullptr && reg->StillOwned()) {
      ReportRange(reg, p->name, p->depth, p->cpu_start_ns, p->cpu_end_ns, start, end, p->stream);
    }
    ReleasePending(p);
    return;
  }
  if (reg != nullptr && reg->StillOwned()) {
    const uint64_t now = MonotonicNs();
    bool open_gate = false;
    if (p->high_priority && NoteHighPriorityCompletion(*reg->own_gate, p->pending_at_ns)) {
      open_gate = true;
    }
    if (p->budget_ns != 0) {
      ReleaseBudget(*reg->gate, p->budget_ns);
      open_gate = true;
    }
    if (open_gate) OpenGate(*reg->gate);
    if (p->timed && measured_on_gpu) ReportTimedSample(p, reg, now);
  }
  ReleasePending(p);
}

}  // namespace orion::interpose
