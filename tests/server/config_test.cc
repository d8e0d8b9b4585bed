// Config parsing: defaults, a full valid file, and bad inputs whose messages name file and key.
#include "server/config.h"

#include "contract/gate_rules.h"

#include <gtest/gtest.h>

namespace orion::server {
namespace {

TEST(ConfigTest, EmptyFileGivesDocumentedDefaults) {
  auto c = ParseServerConfig("", "empty.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->socket_path, "/run/orion/orion.sock");
  EXPECT_EQ(c->admin_address, "127.0.0.1:50051");  // loopback unless asked otherwise
  EXPECT_EQ(c->admin_tokens_file, "");
  EXPECT_EQ(c->agent_socket, "/run/orion-agent/agent.sock");
  EXPECT_EQ(c->metrics_address, "0.0.0.0:9464");
  EXPECT_EQ(c->policy.mode, contract::GateMode::kPriority);
  EXPECT_EQ(c->policy.be_budget_us, 500u);
  EXPECT_EQ(c->policy.sm_threshold, 0u);  // no block limit
  EXPECT_TRUE(c->trust_client_requests);
}

TEST(ConfigTest, PrintedDefaultsAreTheContractsDefaults) {
  // The documented default config (--print-default-config) says what the code does: the same
  // knobs as an empty file, and those are contract/gate_rules.h's.
  auto printed = ParseServerConfig(DefaultConfigYaml(), "default.yaml");
  auto empty = ParseServerConfig("", "empty.yaml");
  ASSERT_TRUE(printed.ok()) << printed.status();
  ASSERT_TRUE(empty.ok()) << empty.status();
  for (const PolicyConfig* p : {&printed->policy, &empty->policy}) {
    EXPECT_EQ(p->mode, contract::kDefaultGateMode);
    EXPECT_EQ(p->be_budget_us * 1000, contract::DefaultBeBudgetNs(p->mode));
    EXPECT_EQ(p->sm_threshold, contract::kDefaultSmThreshold);
    EXPECT_EQ(p->spin_us * 1000ull, contract::kDefaultSpinNs);
    EXPECT_EQ(p->hp_stale_ms * 1000000ull, contract::kDefaultHpStaleNs);
    EXPECT_EQ(p->hp_grace_us * 1000ull, contract::kDefaultHpGraceNs);
    EXPECT_EQ(p->gpu_hold_max_ms * 1000000ull, contract::kDefaultGpuHoldMaxNs);
    EXPECT_EQ(p->gpu_hold_release_ms * 1000000ull, contract::kDefaultGpuHoldReleaseNs);
  }
  EXPECT_EQ(printed->admin_address, empty->admin_address);
  // No key of the printed file replaces a default with something else: the node name stays the
  // host's (not ""), and so do the other values a server reports or listens on.
  EXPECT_FALSE(printed->node_name.empty());
  EXPECT_EQ(printed->node_name, empty->node_name);
  EXPECT_EQ(printed->socket_path, empty->socket_path);
  EXPECT_EQ(printed->admin_tokens_file, empty->admin_tokens_file);
  EXPECT_EQ(printed->gpus, empty->gpus);
  EXPECT_EQ(printed->trust_client_requests, empty->trust_client_requests);
  EXPECT_EQ(printed->rules.size(), empty->rules.size());
  EXPECT_EQ(printed->timeline_spans_per_gpu, empty->timeline_spans_per_gpu);
  EXPECT_EQ(printed->request_range_prefix, empty->request_range_prefix);
  EXPECT_EQ(printed->hp_latency_window, empty->hp_latency_window);
  EXPECT_EQ(printed->policy.adapt_budget, empty->policy.adapt_budget);
  EXPECT_EQ(printed->policy.be_budget_set, empty->policy.be_budget_set);
  EXPECT_EQ(printed->policy.default_latency_target_us, empty->policy.default_latency_target_us);
  EXPECT_EQ(printed->agent_socket, empty->agent_socket);
  EXPECT_EQ(printed->metrics_address, empty->metrics_address);
}

TEST(ConfigTest, AnEmptyNodeNameMeansTheDefault) {
  auto c = ParseServerConfig("node_name: \"\"\n", "empty-name.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->node_name.empty());
  EXPECT_EQ(c->node_name, ParseServerConfig("", "e.yaml")->node_name);
}

TEST(ConfigTest, AgentSocketIsNeverInThePodsRunFolder) {
  auto c = ParseServerConfig("socket_path: /tmp/o/orion.sock\nadmin_auth: {tokens_file: /t}\n",
                             "a.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->agent_socket, "/tmp/o-agent/agent.sock");
  EXPECT_EQ(c->admin_tokens_file, "/t");
  auto d = ParseServerConfig("", "empty.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->agent_socket, "/run/orion-agent/agent.sock");
  auto set = ParseServerConfig("agent_socket: /var/run/a.sock\n", "b.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->agent_socket, "/var/run/a.sock");
  // A pod's root could reach it through the mounted folder: refused at start.
  for (const char* inside : {"agent_socket: /run/orion/agent.sock\n",
                             "agent_socket: /run/orion/sub/agent.sock\n"}) {
    auto bad = ParseServerConfig(inside, "bad.yaml");
    ASSERT_FALSE(bad.ok()) << inside;
    EXPECT_NE(bad.status().message().find("is inside /run/orion/, socket_path's folder, which is "
                                          "mounted into pods"),
              std::string::npos)
        << bad.status();
  }
}

TEST(ConfigTest, LimitsAreReadAndValidated) {
  auto d = ParseServerConfig("", "empty.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  auto printed = ParseServerConfig(DefaultConfigYaml(), "default.yaml");
  ASSERT_TRUE(printed.ok()) << printed.status();
  EXPECT_EQ(printed->max_clients_per_pod, d->max_clients_per_pod);
  EXPECT_EQ(printed->max_clients_per_uid, d->max_clients_per_uid);
  EXPECT_EQ(printed->max_pending_connections, d->max_pending_connections);
  EXPECT_EQ(printed->request_timeout_ms, d->request_timeout_ms);
  auto c = ParseServerConfig(
      "limits: {clients_per_pod: 8, clients_per_uid: 0, pending_connections: 16, "
      "request_timeout_ms: 500}\n",
      "l.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_clients_per_pod, 8u);
  EXPECT_EQ(c->max_clients_per_uid, 0u);
  EXPECT_EQ(c->max_pending_connections, 16u);
  EXPECT_EQ(c->request_timeout_ms, 500u);
  auto bad = ParseServerConfig("limits: {clients_per_pod: 300}\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("limits.clients_per_pod: expected an integer in [0, 256]"),
            std::string::npos)
      << bad.status();
  auto unknown = ParseServerConfig("limits: {clients: 3}\n", "u.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("limits.clients: unknown key"), std::string::npos);
}

TEST(ConfigTest, BudgetDefaultFollowsTheModeUnlessSet) {
  auto mps = ParseServerConfig("mode: mps\n", "mps.yaml");
  ASSERT_TRUE(mps.ok()) << mps.status();
  EXPECT_EQ(mps->policy.be_budget_us, 5000u);
  auto set = ParseServerConfig("mode: mps\npolicy: {be_budget_us: 700}\n", "set.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->policy.be_budget_us, 700u);
  EXPECT_TRUE(set->policy.be_budget_set);
  EXPECT_FALSE(mps->policy.be_budget_set);
  auto other_keys = ParseServerConfig("mode: mps\npolicy: {spin_us: 5}\n", "spin.yaml");
  ASSERT_TRUE(other_keys.ok()) << other_keys.status();
  EXPECT_EQ(other_keys->policy.be_budget_us, 5000u);
}

TEST(ConfigTest, DefaultConfigYamlParsesToTheDefaults) {
  auto a = ParseServerConfig(DefaultConfigYaml(), "default.yaml");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = ParseServerConfig("", "empty.yaml");
  EXPECT_EQ(a->socket_path, b->socket_path);
  EXPECT_EQ(a->policy.be_budget_us, b->policy.be_budget_us);
  EXPECT_EQ(a->policy.sm_threshold, b->policy.sm_threshold);
  EXPECT_EQ(a->policy.spin_us, b->policy.spin_us);
  EXPECT_EQ(a->policy.hp_stale_ms, b->policy.hp_stale_ms);
  EXPECT_EQ(a->policy.hp_grace_us, b->policy.hp_grace_us);
  EXPECT_EQ(a->policy.gpu_hold_max_ms, b->policy.gpu_hold_max_ms);
  EXPECT_EQ(a->policy.gpu_hold_release_ms, b->policy.gpu_hold_release_ms);
  EXPECT_EQ(a->policy.adapt_budget, b->policy.adapt_budget);
  EXPECT_EQ(a->timeline_spans_per_gpu, b->timeline_spans_per_gpu);
}

TEST(ConfigTest, FullConfig) {
  auto c = ParseServerConfig(R"(
node_name: gpu-node-7
socket_path: /var/run/o/orion.sock
mode: mps
gpus: [GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee]
policy: {be_budget_us: 250, sm_threshold: 64, adapt_budget: false, default_latency_target_ms: 15}
standalone:
  trust_client_requests: false
  rules:
    - {process: "serve*", uid: 1000, priority: high, memory_limit: 8Gi, latency_target_ms: 20}
    - {priority: best-effort}
)", "full.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_name, "gpu-node-7");
  EXPECT_EQ(c->policy.mode, contract::GateMode::kMps);
  EXPECT_EQ(c->policy.be_budget_us, 250u);
  EXPECT_EQ(c->policy.sm_threshold, 64u);
  EXPECT_FALSE(c->policy.adapt_budget);
  EXPECT_EQ(c->policy.default_latency_target_us, 15000u);
  EXPECT_FALSE(c->trust_client_requests);
  ASSERT_EQ(c->rules.size(), 2u);
  EXPECT_EQ(c->rules[0].process_glob, "serve*");
  EXPECT_EQ(*c->rules[0].uid, 1000u);
  EXPECT_EQ(c->rules[0].priority, contract::Priority::kHigh);
  EXPECT_EQ(c->rules[0].memory_limit_bytes, 8ull << 30);
  EXPECT_EQ(c->rules[0].latency_target_us, 20000u);
  EXPECT_FALSE(c->rules[1].uid.has_value());
}

struct BadCase {
  const char* yaml;
  const char* must_contain;
};

class BadConfigTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadConfigTest, RejectedWithFileKeyAndExpectation) {
  auto c = ParseServerConfig(GetParam().yaml, "/etc/orion/server.yaml");
  ASSERT_FALSE(c.ok()) << GetParam().yaml;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("/etc/orion/server.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find(GetParam().must_contain), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, BadConfigTest,
    ::testing::Values(
        BadCase{"policy: {be_budget_us: fast}", "policy.be_budget_us: expected an integer"},
        BadCase{"policy: {be_budget_us: -5}", "policy.be_budget_us"},
        BadCase{"policy: {spin_us: 99999999}", "policy.spin_us: expected an integer in [0, 10000]"},
        BadCase{"mode: turbo", "mode: expected one of pass-through, priority, mps"},
        BadCase{"sokcet_path: /x", "sokcet_path: unknown key"},
        BadCase{"board_path: /run/orion/board", "board_path: is no longer used"},
        BadCase{"policy: {be_budget: 3}", "policy.be_budget: unknown key"},
        BadCase{"socket_path: relative.sock", "socket_path: expected an absolute path"},
        BadCase{"admin_address: 50051", "admin_address: expected HOST:PORT"},
        BadCase{"admin_auth: tokens.txt", "admin_auth: expected a map such as {tokens_file: PATH}"},
        BadCase{"admin_auth: {token_file: /x}", "admin_auth.token_file: unknown key"},
        BadCase{"admin_auth: {tls_cert_file: /x.crt}", "tls_cert_file and tls_key_file go together"},
        BadCase{"admin_auth: {client_ca_file: /ca.crt}", "client_ca_file: client certificates need TLS"},
        BadCase{"agent_socket: agent.sock", "agent_socket: expected an absolute path"},
        BadCase{"gpus: GPU-1", "gpus: expected a list"},
        BadCase{"gpus: [nvidia0]", "gpus[0]: expected a GPU UUID"},
        BadCase{"standalone: {rules: [{process: x}]}", "standalone.rules[0]: missing key 'priority'"},
        BadCase{"standalone: {rules: [{priority: urgent}]}",
                "standalone.rules[0].priority: expected high or best-effort"},
        BadCase{"standalone: {rules: [{priority: high, memory_limit: 8Gb}]}",
                "standalone.rules[0].memory_limit: expected a byte size"},
        BadCase{"policy: {adapt_budget: maybe}", "policy.adapt_budget: expected true or false"},
        BadCase{"policy: {gpu_hold_max_ms: 60001}",
                "policy.gpu_hold_max_ms: expected an integer in [0, 60000]"},
        BadCase{"policy: {gpu_hold_release_ms: 600001}",
                "policy.gpu_hold_release_ms: expected an integer in [0, 600000]"},
        BadCase{"policy: {gpu_hold_release_ms: 30s}",
                "policy.gpu_hold_release_ms: expected an integer in [0, 600000]"},
        BadCase{"policy: {predict_drain: false}", "policy.predict_drain: removed"},
        BadCase{"policy: [1, 2]", "policy: expected a map"},
        BadCase{"- just\n- a list", "expected a map of settings"},
        BadCase{"policy: {be_budget_us: [1}", "not valid YAML"}));

TEST(ConfigTest, LineNumbersPointAtTheBadValue) {
  auto c = ParseServerConfig("node_name: a\npolicy:\n  sm_threshold: lots\n", "f.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("f.yaml:3"), std::string::npos)
      << c.status();
}

TEST(ConfigTest, MissingFileIsNotFound) {
  auto c = LoadServerConfig("/nonexistent/orion.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(c.status().message()).find("/nonexistent/orion.yaml"), std::string::npos);
}

TEST(ByteSizeTest, Units) {
  EXPECT_EQ(*ParseByteSize("8Gi"), 8ull << 30);
  EXPECT_EQ(*ParseByteSize("512Mi"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("1G"), 1000000000ull);
  EXPECT_EQ(*ParseByteSize("1048576"), 1048576ull);
  EXPECT_EQ(*ParseByteSize(" 2Ki "), 2048ull);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("Gi").ok());
  EXPECT_FALSE(ParseByteSize("8GB").ok());
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999Ti").ok());
  EXPECT_FALSE(ParseByteSize("20000000Ti").ok());  // overflows 64 bits
}

TEST(PriorityTest, Names) {
  EXPECT_EQ(*ParsePriority("high"), contract::Priority::kHigh);
  EXPECT_EQ(*ParsePriority("Best-Effort"), contract::Priority::kBestEffort);
  EXPECT_FALSE(ParsePriority("urgent").ok());
  EXPECT_STREQ(PriorityName(contract::Priority::kHigh), "high");
}

}  // namespace
}  // namespace orion::server
