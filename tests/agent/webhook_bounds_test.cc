// The real `orion-agent webhook` process under the attacks its bounds are for: slow-header TLS
// clients on the webhook port while the kubelet probes /healthz on the health port, a body that
// trickles in, a 4 MiB body, and bodies under the size limit built to cost the most (a megabyte
// of tiny values, 100,000-deep nesting). Prints what it measures (latencies, the process's peak
// RSS) and asserts the bounds docs/security.md states.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/agent/testdata.h"

extern char** environ;

namespace orion::agent {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{.tv_sec = 20, .tv_usec = 0};  // no test read waits longer
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// A TLS client that writes what it is told, when it is told (the webhook's certificate is not
// checked: the peer is known).
class TlsClient {
 public:
  explicit TlsClient(int port) {
    static SSL_CTX* ctx = [] {
      SSL_CTX* c = SSL_CTX_new(TLS_client_method());
      // TLS 1.2: no session tickets after the handshake, so the socket turns readable only when
      // the server answers (WaitReadable).
      SSL_CTX_set_max_proto_version(c, TLS1_2_VERSION);
      return c;
    }();
    fd_ = Connect(port);
    if (fd_ < 0) return;
    ssl_ = SSL_new(ctx);
    SSL_set_fd(ssl_, fd_);
    if (SSL_connect(ssl_) != 1) {
      SSL_free(ssl_);
      ssl_ = nullptr;
    }
  }
  ~TlsClient() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ssl_ != nullptr; }
  // Whether the server has written (or closed) within `ms`.
  bool WaitReadable(int ms) {
    if (SSL_pending(ssl_) > 0) return true;
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    return poll(&p, 1, ms) > 0;
  }
  bool Send(std::string_view data) {
    size_t done = 0;
    while (done < data.size()) {
      const int n = SSL_write(ssl_, data.data() + done, static_cast<int>(data.size() - done));
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Everything until the server closes (or 20 s pass).
  std::string ReadAll() {
    std::string out;
    char buf[4096];
    int n;
    while ((n = SSL_read(ssl_, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }

 private:
  int fd_ = -1;
  SSL* ssl_ = nullptr;
};

std::string PostHeaders(size_t content_length) {
  return "POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(content_length) + "\r\n\r\n";
}

// GET over plain HTTP; returns the status line.
std::string PlainGet(int port, const std::string& path) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[1024];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out.substr(0, out.find("\r\n"));
}

class WebhookProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // writes to connections the server closed fail instead
    char tmpl[] = "/tmp/orion-webhook-bounds-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const std::string cmd =
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=orion-webhook -keyout " +
        dir_ + "/tls.key -out " + dir_ + "/tls.crt >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl CLI not available";
    const std::string log = dir_ + "/stderr";
    std::vector<std::string> args = {ORION_AGENT_BIN,
                                     "webhook",
                                     "--listen-address=127.0.0.1:0",
                                     "--health-address=127.0.0.1:0",
                                     "--tls-cert=" + dir_ + "/tls.crt",
                                     "--tls-key=" + dir_ + "/tls.key"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    ASSERT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    const std::regex ports(R"(HTTPS, port (\d+)\), .* \(HTTP, port (\d+)\))");
    for (int i = 0; i < 200 && https_port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream in(log);
      std::stringstream text;
      text << in.rdbuf();
      const std::string s = text.str();
      std::smatch m;
      if (std::regex_search(s, m, ports)) {
        https_port_ = std::stoi(m[1]);
        health_port_ = std::stoi(m[2]);
      }
    }
    ASSERT_GT(https_port_, 0) << "orion-agent webhook did not start";
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  // VmHWM (peak) or VmRSS of the webhook process, in MiB.
  double MemoryMiB(const std::string& field) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
    }
    return -1;
  }

  // Sends a whole POST /mutate and returns the answer (status line + body).
  std::string Post(const std::string& body) {
    TlsClient c(https_port_);
    if (!c.ok() || !c.Send(PostHeaders(body.size()) + body)) return "";
    return c.ReadAll();
  }

  std::string dir_;
  pid_t pid_ = 0;
  int https_port_ = 0;
  int health_port_ = 0;
};

TEST_F(WebhookProcessTest, SlowHeaderClientsNeitherDelayHealthNorHoldTheWebhookPastTheTimeout) {
  // 12 clients against 8 worker threads: each finishes its TLS handshake, sends half a request
  // and then one header line every 300 ms, as long as the server lets it.
  constexpr int kSlowClients = 12;
  std::vector<double> held(kSlowClients, -1);
  std::atomic<int> started{0};
  std::vector<std::thread> slow;
  for (int i = 0; i < kSlowClients; ++i) {
    slow.emplace_back([&, i] {
      TlsClient c(https_port_);
      started++;
      if (!c.ok()) return;
      const auto start = Clock::now();
      bool open = c.Send("POST /mutate HTTP/1.1\r\nHost: webhook\r\n");
      while (open && SecondsSince(start) < 15) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        open = c.Send("X-Slow: 1\r\n");
      }
      held[i] = SecondsSince(start);
    });
  }
  // Meanwhile: the kubelet's probe, every 100 ms for 6 s, and one real review.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread review_thread;
  double review_s = -1;
  std::string review;
  review_thread = std::thread([&] {
    const auto start = Clock::now();
    review = Post(testing::ReadTestdata("admission-review-pod-high.json"));
    review_s = SecondsSince(start);
  });
  double worst_probe_ms = 0;
  int probes = 0;
  const auto probing = Clock::now();
  while (SecondsSince(probing) < 6) {
    const auto start = Clock::now();
    EXPECT_EQ(PlainGet(health_port_, "/healthz"), "HTTP/1.1 200 OK");
    worst_probe_ms = std::max(worst_probe_ms, SecondsSince(start) * 1000);
    ++probes;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  review_thread.join();
  for (std::thread& t : slow) t.join();
  double longest_held = 0;
  for (double h : held) longest_held = std::max(longest_held, h);
  std::printf("%d slow-header clients (8 worker threads): /healthz worst %.1f ms over %d probes;"
              " a review meanwhile answered in %.2f s; slow clients cut off after at most %.2f s"
              "\n", kSlowClients, worst_probe_ms, probes, review_s, longest_held);
  EXPECT_LT(worst_probe_ms, 250);
  EXPECT_NE(review.find("HTTP/1.1 200"), std::string::npos) << review.substr(0, 200);
  EXPECT_LT(review_s, 7.0);  // one read timeout (5 s), then a free worker
  for (double h : held) {
    EXPECT_GT(h, 4.0);  // the timeout is 5 s from the worker's start, not earlier
    EXPECT_LT(h, 6.5);
  }
}

TEST_F(WebhookProcessTest, TricklingBodyGets408AtTheReadTimeout) {
  TlsClient c(https_port_);
  ASSERT_TRUE(c.ok());
  const auto start = Clock::now();
  ASSERT_TRUE(c.Send(PostHeaders(100) + "{\"kind\""));
  // One byte every 250 ms (the body would take 23 s), until the server answers.
  for (int i = 0; i < 60 && !c.WaitReadable(250); ++i) {
    if (!c.Send(" ")) break;
  }
  const double s = SecondsSince(start);
  const std::string reply = c.ReadAll();
  std::printf("body trickled at 4 bytes/s: answered \"%s\" after %.2f s\n",
              reply.substr(0, reply.find("\r\n")).c_str(), s);
  EXPECT_EQ(reply.rfind("HTTP/1.1 408", 0), 0u) << reply;
  EXPECT_GT(s, 4.0);
  EXPECT_LT(s, 6.5);
}

TEST_F(WebhookProcessTest, OversizeAndCostlyBodiesAreRefusedAndMemoryStaysSmall) {
  ASSERT_EQ(Post(testing::ReadTestdata("admission-review-pod-high.json")).rfind("HTTP/1.1 200", 0),
            0u);
  const double idle_rss = MemoryMiB("VmRSS");
  const double idle_peak = MemoryMiB("VmHWM");

  // 4 MiB announced: 413 from the Content-Length, before a byte of the body is read.
  {
    TlsClient c(https_port_);
    ASSERT_TRUE(c.ok());
    const auto start = Clock::now();
    ASSERT_TRUE(c.Send(PostHeaders(4 << 20)));
    const std::string reply = c.ReadAll();
    std::printf("4 MiB body announced: \"%s\" in %.1f ms\n",
                reply.substr(0, reply.find("\r\n")).c_str(), SecondsSince(start) * 1000);
    EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply;
    EXPECT_LT(SecondsSince(start), 1.0);
  }
  // 4 MiB of [0,0,...] actually sent, five times: the server closes; nothing grows.
  std::string zeros = "[";
  for (int i = 0; i < (2 << 20) - 1; ++i) zeros += "0,";
  zeros += "0]";
  for (int i = 0; i < 5; ++i) {
    TlsClient c(https_port_);
    ASSERT_TRUE(c.ok());
    (void)c.Send(PostHeaders(zeros.size()) + zeros);
    (void)c.ReadAll();
  }
  const double after_oversize = MemoryMiB("VmHWM");

  // Under the size limit, 8 at once (every worker thread): a megabyte of [0,...] and of
  // [[],[],...], and a 200 KB body nested 100,000 deep.
  std::string wide = "[";
  while (wide.size() < (1 << 20) - 8) wide += "0,";
  wide += "0]";
  std::string lists = "[";
  while (lists.size() < (1 << 20) - 8) lists += "[],";
  lists += "[]]";
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  std::vector<std::thread> clients;
  std::vector<std::string> replies(8);
  std::vector<double> seconds(8);
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      const auto start = Clock::now();
      replies[i] = Post(i == 7 ? deep : i % 2 == 0 ? wide : lists);
      seconds[i] = SecondsSince(start);
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(replies[i].rfind("HTTP/1.1 400", 0), 0u) << replies[i].substr(0, 300);
    EXPECT_NE(replies[i].find(i == 7 ? "nested deeper than 64 levels" : "more than 100000 values"),
              std::string::npos)
        << replies[i].substr(0, 300);
  }
  EXPECT_LT(seconds[7], 1.0);
  const auto start = Clock::now();
  const std::string big_ok = Post(wide);
  const double wide_ms = SecondsSince(start) * 1000;
  const double peak = MemoryMiB("VmHWM");
  std::printf("webhook memory: idle %.1f MiB RSS (peak %.1f); peak after 5 x 4 MiB bodies %.1f;"
              " peak after 8 concurrent 1 MiB worst-case bodies %.1f MiB; deep body answered in "
              "%.1f ms, a 1 MiB one alone in %.1f ms\n",
              idle_rss, idle_peak, after_oversize, peak, seconds[7] * 1000, wide_ms);
  EXPECT_LT(after_oversize - idle_peak, 2.0);
  EXPECT_LT(peak, 56.0);  // the chart's limit is 64 Mi
}

TEST_F(WebhookProcessTest, HealthIsOnItsOwnPlainHttpPort) {
  EXPECT_EQ(PlainGet(health_port_, "/healthz"), "HTTP/1.1 200 OK");
  EXPECT_EQ(PlainGet(health_port_, "/readyz"), "HTTP/1.1 200 OK");
  EXPECT_EQ(PlainGet(health_port_, "/mutate"), "HTTP/1.1 404 Not Found");
}

}  // namespace
}  // namespace orion::agent
