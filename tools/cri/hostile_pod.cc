// orion-hostile: a hostile tenant for tools/check-pods.sh. It runs in a sharing pod of its own
// (uid 1000, the mounts and environment of the device plugin's Allocate answer, no
// capabilities) and tries to change another pod's priority, pause it, and read or write that
// pod's shared-memory area, by every way a tenant has: the registration socket (lying in the
// request), the board it is handed (sealed read-only), the other pod's processes through /proc
// (its memfds, process_vm_readv, ptrace, signals), the node's socket folder, the agent's
// AgentSync socket, the admin API without a token or with a made-up one (through orion-ctl
// from the project's image), every client slot of the node, and a GPU it was not given. Each try
// prints one line,
//   attempt NAME: refused: WHAT HAPPENED      or      attempt NAME: SUCCEEDED: WHAT
// (or `attempt NAME: INCONCLUSIVE: ...` when the target could not be reached at all), and the last
// line is `hostile attempts=N refused=M`. Static (g++ -static): it needs nothing
// from the image it runs in. The check reads its log and asserts every attempt was refused.
//   orion-hostile --socket PATH --gpu-uuid UUID --victim-pid HOSTPID --victim-client ID
//                 --victim-pod UID --admin HOST:PORT --ctl PATH
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "contract/orion_contract.h"

namespace c = orion::contract;

namespace {

int g_attempts = 0, g_refused = 0;

void Attempt(const std::string& name, bool refused, const std::string& what,
             bool inconclusive = false) {
  ++g_attempts;
  g_refused += refused && !inconclusive ? 1 : 0;
  std::printf("attempt %s: %s: %s\n", name.c_str(),
              inconclusive ? "INCONCLUSIVE" : refused ? "refused" : "SUCCEEDED", what.c_str());
  std::fflush(stdout);
}

std::string Err(int e) { return std::string(strerror(e)); }

std::string Arg(int argc, char** argv, const char* name, const char* fallback = "") {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

// Runs argv (no shell), returns its exit status and its output's first line.
int Run(const std::vector<std::string>& args, std::string* first_line) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::printf("exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *first_line = out.substr(0, out.find('\n'));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Registers through the socket; returns it (kept open = registered) or -1.
int Register(const std::string& path, const c::RegisterRequest& req, c::RegisterReply* reply,
             int* fds) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      send(fd, &req, sizeof(req), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(req))) {
    std::printf("register: %s: %s\n", path.c_str(), strerror(errno));
    close(fd);
    return -1;
  }
  int nfds = 0;
  if (!c::ReceiveWithFds(fd, reply, sizeof(*reply), fds, &nfds)) {
    std::printf("register: no reply\n");
    close(fd);
    return -1;
  }
  return fd;
}

// Registers with `req` and closes whatever descriptors the server hands over, keeping only the
// connection (the registration lives as long as it is open). Returns it, or -1; *why gets the
// refusal.
int RegisterKeepingOnlyTheConnection(const std::string& path, const c::RegisterRequest& req,
                                     c::RegisterReply* reply, std::string* why) {
  int fds[c::kRegisterFds];
  for (int& fd : fds) fd = -1;
  const int sock = Register(path, req, reply, fds);
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  if (sock < 0) {
    *why = "no reply";
  } else if (reply->status != 0) {
    *why = "status " + std::to_string(reply->status) + ": " +
           std::string(reply->message, strnlen(reply->message, sizeof(reply->message)));
    close(sock);
    return -1;
  }
  return sock;
}

const c::ClientSlot* SlotOfPid(const c::Board& board, uint32_t pid) {
  for (const c::ClientSlot& s : board.slots) {
    if (s.state.load() == static_cast<uint32_t>(c::SlotState::kActive) && s.host_pid.load() == pid) {
      return &s;
    }
  }
  return nullptr;
}

// Regular files and sockets under `dir`, recursively.
void Walk(const std::string& dir, std::vector<std::string>* out) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      Walk(path, out);
    } else {
      out->push_back(path);
    }
  }
  closedir(d);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // one line at a time into the container's log
  const std::string socket_path = Arg(argc, argv, "--socket", "/run/orion/orion.sock");
  const std::string gpu_uuid = Arg(argc, argv, "--gpu-uuid");
  const uint32_t victim_pid = static_cast<uint32_t>(std::atoi(Arg(argc, argv, "--victim-pid", "0").c_str()));
  const std::string victim_client = Arg(argc, argv, "--victim-client");
  const std::string victim_pod = Arg(argc, argv, "--victim-pod");
  const std::string admin = Arg(argc, argv, "--admin");
  const std::string ctl = Arg(argc, argv, "--ctl", "/usr/local/bin/orion-ctl");
  if (victim_pid == 0 || gpu_uuid.empty() || victim_client.empty() || victim_pod.empty() ||
      admin.empty()) {
    std::fprintf(stderr, "usage: orion-hostile --socket PATH --gpu-uuid UUID --victim-pid PID "
                         "--victim-client ID --victim-pod UID --admin HOST:PORT [--ctl PATH]\n");
    return 2;
  }
  std::printf("hostile: pid %d, uid %d, victim host pid %u, client %s, "
              "pod %s\n", getpid(), getuid(), victim_pid, victim_client.c_str(), victim_pod.c_str());

  // How it runs (the check asserts it is confined like every sharing pod).
  std::string status_line = "hostile: status uid " + std::to_string(getuid());
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f)) {
      for (const char* key : {"Seccomp:", "NoNewPrivs:", "CapEff:"}) {
        if (std::strncmp(line, key, std::strlen(key)) == 0) {
          std::string v = line + std::strlen(key);
          v.erase(0, v.find_first_not_of(" \t"));
          v.erase(v.find_last_not_of(" \t\n") + 1);
          status_line += std::string(" ") + std::string(key, std::strlen(key) - 1) + " " + v;
        }
      }
    }
    std::fclose(f);
  }
  std::printf("%s\n", status_line.c_str());

  // 1. Register on the victim's GPU, claiming high priority and the victim's pid.
  c::RegisterRequest req{};
  req.header = c::MakeHeader(c::MessageType::kRegister, sizeof(req));
  req.claimed_pid = victim_pid;
  std::snprintf(req.gpu_uuid, sizeof(req.gpu_uuid), "%s", gpu_uuid.c_str());
  req.requested_priority = static_cast<uint32_t>(c::Priority::kHigh);
  std::snprintf(req.process_name, sizeof(req.process_name), "orion-sample-infer");
  c::RegisterReply reply{};
  int fds[c::kRegisterFds];
  const int sock = Register(socket_path, req, &reply, fds);
  if (sock < 0 || reply.status != 0) {
    std::printf("hostile: could not register (status %u: %s): nothing else to try\n",
                sock < 0 ? 99u : reply.status, reply.message);
    return 3;
  }
  const auto* board = static_cast<const c::Board*>(
      mmap(nullptr, sizeof(c::Board), PROT_READ, MAP_SHARED, fds[c::kBoardFd], 0));
  auto* area = static_cast<c::ClientArea*>(mmap(nullptr, sizeof(c::ClientArea),
                                               PROT_READ | PROT_WRITE, MAP_SHARED,
                                               fds[c::kAreaFd], 0));
  if (board == MAP_FAILED || area == MAP_FAILED) {
    std::printf("hostile: cannot map what the server handed over: %s\n", strerror(errno));
    return 3;
  }
  const c::ClientSlot* mine = &board->slots[reply.slot];
  const bool high = reply.priority == static_cast<uint32_t>(c::Priority::kHigh) ||
                    mine->priority.load() == static_cast<uint32_t>(c::Priority::kHigh);
  Attempt("register-claiming-high-priority-and-the-victims-pid", !high && mine->host_pid.load() != victim_pid,
          "registered as client " + std::to_string(reply.client_id) + " in slot " +
              std::to_string(reply.slot) + ", priority " + (high ? "high" : "best-effort") +
              " (decided by the server from its pod), host pid on the board " +
              std::to_string(mine->host_pid.load()));
  Attempt("be-handed-another-clients-area", area->header.slot == reply.slot &&
              area->header.client_id == reply.client_id,
          "the area it was handed is slot " + std::to_string(area->header.slot) + ", client " +
              std::to_string(area->header.client_id));

  const c::ClientSlot* victim = SlotOfPid(*board, victim_pid);
  if (victim == nullptr) {
    std::printf("hostile: the victim (host pid %u) is not on the board\n", victim_pid);
    return 3;
  }
  const uint32_t victim_slot = static_cast<uint32_t>(victim - board->slots);
  const uint32_t prio_before = victim->priority.load(), paused_before = victim->paused.load();
  std::printf("victim on the board: slot %u, priority %u, paused %u\n", victim_slot, prio_before,
              paused_before);

  // 2. The board (priorities, pauses of everyone): every way to write it.
  const int bfd = fds[c::kBoardFd];
  void* w = mmap(nullptr, sizeof(c::Board), PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
  Attempt("board-writable-mmap", w == MAP_FAILED, w == MAP_FAILED ? Err(errno) : "mapped writable");
  if (w != MAP_FAILED) {
    auto* wb = static_cast<c::Board*>(w);
    wb->slots[victim_slot].priority.store(static_cast<uint32_t>(c::Priority::kBestEffort));
    wb->slots[victim_slot].paused.store(1);
  }
  const uint32_t one = 1;
  const off_t paused_at = static_cast<off_t>(reinterpret_cast<const char*>(&victim->paused) -
                                             reinterpret_cast<const char*>(board));
  ssize_t n = pwrite(bfd, &one, sizeof(one), paused_at);
  Attempt("board-pwrite-victim-paused", n < 0, n < 0 ? Err(errno) : "wrote the victim's pause");
  const int tr = ftruncate(bfd, 0);
  Attempt("board-ftruncate", tr != 0, tr != 0 ? Err(errno) : "truncated the board");
  const std::string again = "/proc/self/fd/" + std::to_string(bfd);
  const int rfd = open(again.c_str(), O_RDWR | O_CLOEXEC);
  if (rfd < 0) {
    Attempt("board-reopen-read-write", true, "open " + again + ": " + Err(errno));
  } else {
    void* w2 = mmap(nullptr, sizeof(c::Board), PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
    const ssize_t n2 = pwrite(rfd, &one, sizeof(one), paused_at);
    Attempt("board-reopen-read-write", w2 == MAP_FAILED && n2 < 0,
            std::string("reopened; writable mmap ") + (w2 == MAP_FAILED ? "failed" : "WORKED") +
                ", pwrite " + (n2 < 0 ? "failed" : "WORKED"));
    close(rfd);
  }
  const int mp = mprotect(const_cast<c::Board*>(board), 4096, PROT_READ | PROT_WRITE);
  Attempt("board-mprotect-writable", mp != 0, mp != 0 ? Err(errno) : "made the mapping writable");

  // 3. The victim's process and its memfds (its client area), through /proc.
  const std::string vproc = "/proc/" + std::to_string(victim_pid);
  struct stat st {};
  Attempt("see-the-victims-process", stat(vproc.c_str(), &st) != 0,
          stat(vproc.c_str(), &st) != 0 ? vproc + ": " + Err(errno) : vproc + " exists here");
  int procs = 0, others_opened = 0;
  std::string opened_what;
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      const int pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      ++procs;
      if (pid == getpid()) continue;
      for (const char* sub : {"fd", "map_files"}) {
        const std::string dir = "/proc/" + std::to_string(pid) + "/" + sub;
        DIR* fdd = opendir(dir.c_str());
        if (fdd == nullptr) continue;
        while (dirent* f = readdir(fdd)) {
          if (f->d_name[0] == '.') continue;
          const std::string link = dir + "/" + f->d_name;
          char target[256] = {};
          if (readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
          if (std::strstr(target, "memfd:") == nullptr && std::strstr(target, "orion") == nullptr) continue;
          const int ofd = open(link.c_str(), O_RDONLY | O_CLOEXEC);
          if (ofd >= 0) {
            ++others_opened;
            opened_what += " " + link + " -> " + target;
            close(ofd);
          }
        }
        closedir(fdd);
      }
    }
    closedir(d);
  }
  Attempt("open-other-processes-memfds-via-proc", others_opened == 0,
          std::to_string(procs) + " processes visible (its own pid namespace); " +
              std::to_string(others_opened) + " shared-memory files of others opened" + opened_what);
  char buf[64];
  iovec local{buf, sizeof(buf)}, remote{reinterpret_cast<void*>(0x400000), sizeof(buf)};
  n = process_vm_readv(static_cast<pid_t>(victim_pid), &local, 1, &remote, 1, 0);
  Attempt("process_vm_readv-victim", n < 0, n < 0 ? Err(errno) : "read the victim's memory");
  const long pt = ptrace(PTRACE_SEIZE, static_cast<pid_t>(victim_pid), nullptr, nullptr);
  Attempt("ptrace-victim", pt != 0, pt != 0 ? Err(errno) : "attached");
  if (pt == 0) ptrace(PTRACE_DETACH, static_cast<pid_t>(victim_pid), nullptr, nullptr);
  const int k = kill(static_cast<pid_t>(victim_pid), SIGSTOP);
  if (k == 0) kill(static_cast<pid_t>(victim_pid), SIGCONT);
  Attempt("sigstop-victim", k != 0, k != 0 ? Err(errno) : "stopped it");

  // 4. The node's socket folder (mounted read-only) and shared memory by name.
  std::vector<std::string> files;
  Walk(socket_path.substr(0, socket_path.rfind('/')), &files);
  Walk("/dev/shm", &files);
  int writable = 0;
  std::string listed;
  for (const std::string& f : files) {
    listed += " " + f;
    const int ofd = open(f.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (ofd >= 0) {
      ++writable;
      close(ofd);
    }
  }
  Attempt("open-node-and-shm-files-read-write", writable == 0,
          std::to_string(files.size()) + " files (" + (listed.empty() ? " none" : listed) +
              "), " + std::to_string(writable) + " opened read-write");
  const int ul = unlink(socket_path.c_str());
  Attempt("remove-the-nodes-socket", ul != 0, ul != 0 ? Err(errno) : "removed it");
  const std::string planted = socket_path.substr(0, socket_path.rfind('/')) + "/board";
  const int cf = open(planted.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
  Attempt("create-a-file-in-the-nodes-socket-folder", cf < 0, cf < 0 ? Err(errno) : "created " + planted);
  if (cf >= 0) close(cf);

  // 5. The agent's AgentSync socket (sets pod priorities): not in this pod.
  for (const std::string& p : {std::string("/run/orion-agent/agent.sock"),
                               socket_path.substr(0, socket_path.rfind('/')) + "/agent.sock"}) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", p.c_str());
    const int cr = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    Attempt("connect-agentsync " + p, cr != 0, cr != 0 ? Err(errno) : "connected");
    close(fd);
  }

  // 6. The admin API (it is reachable: here the pods share the node's network): no token, and a
  // made-up one (a memfd the child reads as /proc/self/fd/N).
  const int tfd = memfd_create("forged-token", 0);
  const char forged[] = "operator admin 0123456789abcdef0123456789abcdef01234567\n";
  if (tfd < 0 || write(tfd, forged, sizeof(forged) - 1) < 0) {
    std::printf("hostile: memfd for the made-up token: %s\n", strerror(errno));
  }
  const std::string forged_file = "/proc/self/fd/" + std::to_string(tfd);
  struct Call {
    const char* name;
    std::vector<std::string> args;
  };
  const std::vector<Call> calls = {
      {"admin-priority-of-victims-pod", {"priority", "--pod", victim_pod, "best-effort"}},
      {"admin-pause-victim", {"pause", victim_client}},
      {"admin-policy-pass-through", {"policy", "--all", "mode=pass-through"}},
  };
  for (const Call& call : calls) {
    for (int forge = 0; forge < 2; ++forge) {
      std::vector<std::string> args = {ctl, "--server", admin};
      if (forge) {
        args.push_back("--token-file");
        args.push_back(forged_file);
      }
      args.insert(args.end(), call.args.begin(), call.args.end());
      std::string line;
      const int rc = Run(args, &line);
      // Refused by the server, not merely unreachable (then nothing was shown).
      Attempt(std::string(call.name) + (forge ? "-made-up-token" : "-no-token"), rc != 0,
              "orion-ctl exit " + std::to_string(rc) + ": " + line,
              rc != 0 && line.find("cannot reach orion-server") != std::string::npos);
    }
  }

  // 7. Slots and GPUs: take every client slot of the node from this one pod (the server caps a
  // pod's slots, limits.clients_per_pod), and register on a GPU the pod was not given.
  {
    c::RegisterRequest flood = req;
    flood.requested_priority = static_cast<uint32_t>(c::Priority::kBestEffort);
    std::vector<int> held;
    std::string why = "all " + std::to_string(c::kMaxSlots) + " taken";
    while (held.size() + 1 < c::kMaxSlots) {
      c::RegisterReply r{};
      const int s = RegisterKeepingOnlyTheConnection(socket_path, flood, &r, &why);
      if (s < 0) break;
      held.push_back(s);
    }
    const bool pod_cap = why.find("limits.clients_per_pod") != std::string::npos;
    Attempt("take-every-client-slot-of-the-node", pod_cap,
            "held " + std::to_string(held.size() + 1) + " slots of " +
                std::to_string(c::kMaxSlots) + ", then: " + why);
    for (int s : held) close(s);
  }
  {
    c::RegisterRequest foreign = req;
    foreign.requested_priority = static_cast<uint32_t>(c::Priority::kBestEffort);
    std::snprintf(foreign.gpu_uuid, sizeof(foreign.gpu_uuid), "%s",
                  "GPU-0badc0de-0000-4000-8000-000000000001");
    c::RegisterReply r{};
    std::string why;
    const int s = RegisterKeepingOnlyTheConnection(socket_path, foreign, &r, &why);
    Attempt("register-on-a-gpu-the-pod-was-not-given", s < 0,
            s < 0 ? why : "registered on it, slot " + std::to_string(r.slot));
    if (s >= 0) close(s);
  }

  // The victim as the server decides it, after all this.
  const uint32_t prio_after = victim->priority.load(), paused_after = victim->paused.load();
  std::printf("victim on the board after: slot %u, priority %u (before %u), paused %u (before %u)\n",
              victim_slot, prio_after, prio_before, paused_after, paused_before);
  std::printf("hostile attempts=%d refused=%d\n", g_attempts, g_refused);
  close(sock);
  return 0;
}
