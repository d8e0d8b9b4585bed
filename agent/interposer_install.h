// Installs liborion_interpose.so into a host folder that pods mount read-only. Every version
// gets its own folder, named by a hash of the library's bytes, that is complete before it
// becomes visible: the file is written and fsynced in a temporary folder, which is then renamed
// into place (atomic); `current` is a symlink swapped by rename. A running pod keeps the
// version it started with; old versions beyond `keep_versions` are pruned, except those a running
// process still uses: the interposer holds a shared flock(2) on its own file for the life of the
// process (interpose/version_pin.cc), and pruning needs an exclusive one.
//
//   <lib_dir>/versions/<hash>/liborion_interpose.so
//   <lib_dir>/current -> versions/<hash>
//
// Usage:
//   absl::StatusOr<std::string> dir = InstallInterposer("/opt/orion/lib/liborion_interpose.so",
//                                                       "/var/lib/orion");
//   plugin.SetHostLibDir(*dir);
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace orion::agent {

// Returns the version folder (absolute) holding the installed library.
absl::StatusOr<std::string> InstallInterposer(const std::string& source_file,
                                              const std::string& lib_dir, int keep_versions = 3);

// True while some process holds the interposer of `version_dir` loaded.
bool InterposerVersionInUse(const std::string& version_dir);

// 16 hex digits of a 64-bit FNV-1a hash: names a version folder.
std::string ContentVersion(const std::string& bytes);

}  // namespace orion::agent
