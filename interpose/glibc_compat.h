// Pins the glibc symbol versions the interposer imports to the oldest ones (<= GLIBC_2.17).
//
// glibc 2.34 moved libdl and libpthread into libc and gave dlsym, dlopen, pthread_* new default
// versions (GLIBC_2.34); binding to those would stop the library loading into containers built
// on older distributions. Every translation unit of the library includes this header first, and
// the export test checks `objdump -T` for anything newer than GLIBC_2.17. dlsym is not pinned:
// the library defines it (proc_address.cc) and calls the real one through dlvsym.
#pragma once

#if defined(__x86_64__)
#define ORION_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define ORION_GLIBC_BASE "GLIBC_2.17"
#endif

#ifdef ORION_GLIBC_BASE
__asm__(".symver dlvsym,dlvsym@" ORION_GLIBC_BASE);
__asm__(".symver dlopen,dlopen@" ORION_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" ORION_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" ORION_GLIBC_BASE);
__asm__(".symver dladdr,dladdr@" ORION_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" ORION_GLIBC_BASE);
__asm__(".symver pthread_create,pthread_create@" ORION_GLIBC_BASE);
__asm__(".symver pthread_detach,pthread_detach@" ORION_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" ORION_GLIBC_BASE);
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@" ORION_GLIBC_BASE);
__asm__(".symver pthread_atfork,pthread_atfork@" ORION_GLIBC_BASE);
__asm__(".symver pthread_key_create,pthread_key_create@" ORION_GLIBC_BASE);
__asm__(".symver pthread_setspecific,pthread_setspecific@" ORION_GLIBC_BASE);
#endif

// Thread-local words the launch path touches on every call: initial-exec, so an access is an
// offset from the thread pointer instead of a __tls_get_addr call. The library is preloaded, so
// they sit in the initial TLS block; kept to a few words, so that a dlopen of the library would
// still fit in glibc's static TLS reserve.
#define ORION_INITIAL_EXEC_TLS __attribute__((tls_model("initial-exec")))
