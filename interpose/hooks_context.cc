// Context hooks: every driver entry point that can change a thread's current context tells the
// interposer so (NoteContextChange), so that the other hooks can keep the context they read
// last instead of asking the driver on every call (CurrentContext in client_state.cc).
#include "interpose/glibc_compat.h"

#include "interpose/client_state.h"
#include "interpose/real_driver.h"

namespace {

CUresult Changed(CUresult result) {
  orion::interpose::NoteContextChange();
  return result;
}

}  // namespace

#define ORION_CONTEXT_HOOK(name, params, args) \
  CUresult CUDAAPI name params {               \
    ORION_REAL_OR_RETURN(name)                 \
    return Changed(real args);                 \
  }

ORION_CONTEXT_HOOK(cuCtxSetCurrent, (CUcontext ctx), (ctx))
ORION_CONTEXT_HOOK(cuCtxPushCurrent, (CUcontext ctx), (ctx))
ORION_CONTEXT_HOOK(cuCtxPushCurrent_v2, (CUcontext ctx), (ctx))
ORION_CONTEXT_HOOK(cuCtxPopCurrent, (CUcontext * ctx), (ctx))
ORION_CONTEXT_HOOK(cuCtxPopCurrent_v2, (CUcontext * ctx), (ctx))
ORION_CONTEXT_HOOK(cuCtxCreate, (CUcontext * ctx, unsigned int flags, CUdevice dev),
                   (ctx, flags, dev))
ORION_CONTEXT_HOOK(cuCtxCreate_v2, (CUcontext * ctx, unsigned int flags, CUdevice dev),
                   (ctx, flags, dev))
ORION_CONTEXT_HOOK(cuCtxCreate_v3,
                   (CUcontext * ctx, CUexecAffinityParam* params, int count, unsigned int flags,
                    CUdevice dev),
                   (ctx, params, count, flags, dev))
ORION_CONTEXT_HOOK(cuCtxCreate_v4,
                   (CUcontext * ctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev),
                   (ctx, params, flags, dev))
ORION_CONTEXT_HOOK(cuCtxDestroy, (CUcontext ctx), (ctx))
ORION_CONTEXT_HOOK(cuCtxDestroy_v2, (CUcontext ctx), (ctx))
ORION_CONTEXT_HOOK(cuDevicePrimaryCtxRelease, (CUdevice dev), (dev))
ORION_CONTEXT_HOOK(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))
ORION_CONTEXT_HOOK(cuDevicePrimaryCtxReset, (CUdevice dev), (dev))
ORION_CONTEXT_HOOK(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev))
ORION_CONTEXT_HOOK(cuGreenCtxDestroy, (CUgreenCtx ctx), (ctx))
