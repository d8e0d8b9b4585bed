// Marks the loaded interposer version as in use so the agent does not prune it (version_pin.cc).
#pragma once

namespace orion::interpose {

// Takes a shared flock on this library's own file; once per process, best effort.
void PinLoadedVersion();

}  // namespace orion::interpose
