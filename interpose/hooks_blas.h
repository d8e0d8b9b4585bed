// What the rest of the interposer asks of the cuBLAS hooks (hooks_blas.cc).
#pragma once

namespace orion::interpose {

// In a fork child (OnForkChild): the shape table's lock anew, no timed call in flight.
void ResetGemmSplitAfterFork();

}  // namespace orion::interpose
