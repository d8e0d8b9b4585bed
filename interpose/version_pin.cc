// Marks the interposer file this process loaded as in use: a shared flock(2) on it, taken at the
// process's first CUDA call (the library runs no constructors) and held for the life of the
// process (and its forks). The agent installs every interposer version in its own
// folder and prunes old versions only when it can take an exclusive lock on the file, so a
// version stays on the node while any process still runs it (docs/kubernetes.md, upgrades).
// Best effort: any failure leaves the process running without the mark.
#include "interpose/glibc_compat.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "interpose/version_pin.h"

namespace orion::interpose {

void PinLoadedVersion() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&PinLoadedVersion), &info) == 0 ||
      info.dli_fname == nullptr || info.dli_fname[0] != '/') {
    return;
  }
  const int fd = open(info.dli_fname, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  // Never wait: an agent pruning this very version holds LOCK_EX for a moment only, and a
  // process start must not block on it.
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) close(fd);
  // On success the descriptor stays open on purpose: closing it would drop the lock.
}

}  // namespace orion::interpose
