// Resolution of the real CUDA driver and of the real dlsym.
#include "interpose/glibc_compat.h"

#include "interpose/real_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

namespace orion::interpose {

void* g_real_hooks[kHookCount];
void* g_driver_fns[kDriverFnCount];

void* const g_hook_fns[kHookCount] = {
#define ORION_HOOK(name, params, args) reinterpret_cast<void*>(&::name),
#include "interpose/hooked_functions.def"
#undef ORION_HOOK
};

const char* const g_hook_names[kHookCount] = {
#define ORION_HOOK(name, params, args) #name,
#include "interpose/hooked_functions.def"
#undef ORION_HOOK
};

namespace {

using DlsymFn = void* (*)(void*, const char*);

const char* const kDriverFnNames[kDriverFnCount][2] = {
#define ORION_DRIVER_FN(name, fallback, params) {#name, #fallback},
#include "interpose/driver_functions.def"
#undef ORION_DRIVER_FN
};

DlsymFn g_real_dlsym = nullptr;
pthread_once_t g_dlsym_once = PTHREAD_ONCE_INIT;
pthread_once_t g_driver_once = PTHREAD_ONCE_INIT;
void* g_libcuda = nullptr;

void ResolveRealDlsym() {
  // dlvsym is not hooked, so this finds glibc's dlsym whichever version this glibc has.
  void* fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (fn == nullptr) fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (fn == nullptr) fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
  g_real_dlsym = reinterpret_cast<DlsymFn>(fn);
}

void ResolveDriver() {
  // Prefer the copy the process already loaded (a container may carry its own libcuda path).
  g_libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (g_libcuda == nullptr) g_libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (g_libcuda == nullptr) g_libcuda = dlopen("libcuda.so", RTLD_NOW | RTLD_GLOBAL);
  if (g_libcuda == nullptr) return;
  for (int i = 0; i < kHookCount; ++i) {
    void* fn = RealDlsym(g_libcuda, g_hook_names[i]);
    // A driver that resolves a name to our own export (libcuda linked against us) is no driver.
    g_real_hooks[i] = fn == g_hook_fns[i] ? nullptr : fn;
  }
  for (int i = 0; i < kDriverFnCount; ++i) {
    void* fn = RealDlsym(g_libcuda, kDriverFnNames[i][0]);
    if (fn == nullptr) fn = RealDlsym(g_libcuda, kDriverFnNames[i][1]);
    g_driver_fns[i] = fn;
  }
}

}  // namespace

void* RealDlsym(void* handle, const char* name) {
  pthread_once(&g_dlsym_once, ResolveRealDlsym);
  if (g_real_dlsym == nullptr) return nullptr;
  return g_real_dlsym(handle, name);
}

bool EnsureDriverResolved() {
  pthread_once(&g_driver_once, ResolveDriver);
  return g_libcuda != nullptr;
}

int FindHookByName(const char* name) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return -1;
  for (int i = 0; i < kHookCount; ++i) {
    if (strcmp(name, g_hook_names[i]) == 0) return i;
  }
  return -1;
}

int FindHookByRealPointer(const void* fn) {
  if (fn == nullptr) return -1;
  for (int i = 0; i < kHookCount; ++i) {
    if (g_real_hooks[i] == fn) return i;
  }
  return -1;
}

}  // namespace orion::interpose
