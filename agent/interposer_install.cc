// Versioned, atomic installation of the interposer (see interposer_install.h).
#include "agent/interposer_install.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/share_allocation.h"

namespace orion::agent {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteFileDurably(const std::string& path, const std::string& bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (fd < 0) return Errno("create " + path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      close(fd);
      return Errno("write " + path);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    close(fd);
    return Errno("fsync " + path);
  }
  if (close(fd) != 0) return Errno("close " + path);
  return absl::OkStatus();
}

void SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

}  // namespace

std::string ContentVersion(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

absl::StatusOr<std::string> InstallInterposer(const std::string& source_file,
                                              const std::string& lib_dir, int keep_versions) {
  std::ifstream in(source_file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(source_file, ": cannot read the interposer"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  if (bytes.size() < 4 || bytes.compare(0, 4, "\x7f" "ELF") != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source_file, ": not an ELF shared library"));
  }
  const std::string version = ContentVersion(bytes);
  const std::string versions = absl::StrCat(lib_dir, "/versions");
  const std::string target = absl::StrCat(versions, "/", version);
  const std::string file_name(kInterposerFileName);
  std::error_code ec;
  fs::create_directories(versions, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", versions, ": ", ec.message()));

  if (!fs::exists(absl::StrCat(target, "/", file_name))) {
    const std::string staging = absl::StrCat(versions, "/.staging-", version, "-", getpid());
    fs::remove_all(staging, ec);
    if (mkdir(staging.c_str(), 0755) != 0) return Errno("mkdir " + staging);
    absl::Status s = WriteFileDurably(absl::StrCat(staging, "/", file_name), bytes);
    if (s.ok()) {
      SyncDir(staging);
      // rename(2) of a folder is atomic: pods see no folder or a complete one.
      if (rename(staging.c_str(), target.c_str()) != 0 && errno != EEXIST && errno != ENOTEMPTY) {
        s = Errno("rename " + staging);
      }
    }
    fs::remove_all(staging, ec);  // left over if another agent won the rename
    if (!s.ok()) return s;
    SyncDir(versions);
  }

  const std::string link = absl::StrCat(lib_dir, "/current");
  const std::string tmp_link = absl::StrCat(lib_dir, "/.current-", getpid());
  unlink(tmp_link.c_str());
  if (symlink(absl::StrCat("versions/", version).c_str(), tmp_link.c_str()) != 0) {
    return Errno("symlink " + tmp_link);
  }
  if (rename(tmp_link.c_str(), link.c_str()) != 0) return Errno("rename " + tmp_link);
  SyncDir(lib_dir);

  // Prune the oldest versions; a pod still using one keeps its bind mount of it.
  std::vector<fs::directory_entry> old;
  for (const auto& e : fs::directory_iterator(versions, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name != version && name[0] != '.') old.push_back(e);
  }
  std::sort(old.begin(), old.end(), [](const auto& a, const auto& b) {
    return a.last_write_time() > b.last_write_time();
  });
  for (size_t i = std::max(0, keep_versions - 1); i < old.size(); ++i) {
    const std::string dir = old[i].path().string();
    const std::string file = absl::StrCat(dir, "/", file_name);
    // A process that loaded this version holds a shared lock on the file (interpose/
    // version_pin.cc); the exclusive lock is held until the folder is renamed away, so no
    // process can mark it in between.
    const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      std::fprintf(stderr, "orion-agent: keeping interposer version %s: a running process uses it\n",
                   old[i].path().filename().c_str());
      continue;
    }
    const std::string retired = absl::StrCat(versions, "/.retired-", old[i].path().filename().string());
    fs::remove_all(retired, ec);
    const bool moved = rename(dir.c_str(), retired.c_str()) == 0;
    if (fd >= 0) close(fd);
    fs::remove_all(moved ? retired : dir, ec);
  }
  return target;
}

bool InterposerVersionInUse(const std::string& version_dir) {
  const std::string file = absl::StrCat(version_dir, "/", std::string(kInterposerFileName));
  const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool in_use = flock(fd, LOCK_EX | LOCK_NB) != 0;
  close(fd);
  return in_use;
}

}  // namespace orion::agent
