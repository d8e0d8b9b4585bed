// YAML parsing and validation of orion-server's config (see config.h).
#include "server/config.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace orion::server {
namespace {

using contract::GateMode;
using contract::Priority;

// Error helper that always names file, key and expectation.
class Validator {
 public:
  explicit Validator(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const std::string& key, const std::string& expected,
                     const YAML::Node& got) const {
    std::string shown;
    if (got.IsScalar()) {
      shown = absl::StrCat("\"", got.Scalar(), "\"");
    } else if (got.IsSequence()) {
      shown = "a list";
    } else if (got.IsMap()) {
      shown = "a map";
    } else {
      shown = "nothing";
    }
    std::string where = source_;
    if (got.Mark().line >= 0) absl::StrAppend(&where, ":", got.Mark().line + 1);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", key, ": expected ", expected, ", got ", shown));
  }
  absl::Status Plain(const std::string& key, const std::string& message) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", key, ": ", message));
  }

  // Keys of earlier versions that are gone, with what to do instead.
  const std::map<std::string, std::string> removed_keys_ = {
      {"policy.predict_drain",
       "removed (best-effort work held while high-priority clients are idle goes when "
       "completions give its budget back; the predicted drain gained nothing on the GPU): "
       "delete this key"}};

  absl::Status CheckKeys(const YAML::Node& map, const std::string& prefix,
                         const std::set<std::string>& allowed) const {
    for (const auto& kv : map) {
      const std::string k = kv.first.as<std::string>();
      if (!allowed.count(k) && removed_keys_.count(prefix + "." + k)) {
        return absl::InvalidArgumentError(
            absl::StrCat(source_, ":", kv.first.Mark().line + 1, ": ", prefix, ".", k, ": ",
                         removed_keys_.at(prefix + "." + k)));
      }
      if (!allowed.count(k)) {
        return absl::InvalidArgumentError(absl::StrCat(
            source_, ":", kv.first.Mark().line + 1, ": ", prefix.empty() ? "" : prefix + ".", k,
            ": unknown key (expected one of: ", absl::StrJoin(allowed, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status String(const YAML::Node& n, const std::string& key, std::string* out) const {
    if (!n) return absl::OkStatus();
    if (!n.IsScalar()) return Error(key, "a string", n);
    *out = n.Scalar();
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Int(const YAML::Node& n, const std::string& key, uint64_t lo, uint64_t hi,
                   T* out) const {
    if (!n) return absl::OkStatus();
    uint64_t v = 0;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v) || v < lo || v > hi) {
      return Error(key, absl::StrCat("an integer in [", lo, ", ", hi, "]"), n);
    }
    *out = static_cast<T>(v);
    return absl::OkStatus();
  }
  absl::Status Bool(const YAML::Node& n, const std::string& key, bool* out) const {
    if (!n) return absl::OkStatus();
    const std::string s = n.IsScalar() ? absl::AsciiStrToLower(n.Scalar()) : "";
    if (s == "true" || s == "yes" || s == "on") {
      *out = true;
    } else if (s == "false" || s == "no" || s == "off") {
      *out = false;
    } else {
      return Error(key, "true or false", n);
    }
    return absl::OkStatus();
  }
  absl::Status Bytes(const YAML::Node& n, const std::string& key, uint64_t* out) const {
    if (!n) return absl::OkStatus();
    if (!n.IsScalar()) return Error(key, "a byte size such as 8Gi, 512Mi or 1048576", n);
    auto v = ParseByteSize(n.Scalar());
    if (!v.ok()) return Error(key, "a byte size such as 8Gi, 512Mi or 1048576", n);
    *out = *v;
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

#define ORION_RETURN_IF_ERROR(expr)        \
  do {                                     \
    absl::Status _st = (expr);             \
    if (!_st.ok()) return _st;             \
  } while (0)

absl::Status ParsePolicy(const Validator& v, const YAML::Node& n, const YAML::Node& mode,
                         PolicyConfig* p) {
  if (mode) {
    if (!mode.IsScalar() || !ParseGateMode(mode.Scalar()).ok()) {
      return v.Error("mode", "one of pass-through, priority, mps", mode);
    }
    p->mode = *ParseGateMode(mode.Scalar());
  }
  p->be_budget_us = DefaultBeBudgetUs(p->mode);  // unless policy.be_budget_us says otherwise
  if (!n) return absl::OkStatus();
  if (!n.IsMap()) return v.Error("policy", "a map", n);
  ORION_RETURN_IF_ERROR(v.CheckKeys(n, "policy",
                                    {"be_budget_us", "sm_threshold", "spin_us", "hp_stale_ms",
                                     "hp_grace_us", "adapt_budget", "gpu_hold", "gpu_hold_max_ms",
                                     "gpu_hold_release_ms",
                                     "default_latency_target_ms", "high_priority_namespaces",
                                     "min_latency_target_ms", "high_priority_per_gpu"}));
  ORION_RETURN_IF_ERROR(
      v.Int(n["be_budget_us"], "policy.be_budget_us", 0, 1000000, &p->be_budget_us));
  p->be_budget_set = static_cast<bool>(n["be_budget_us"]);
  ORION_RETURN_IF_ERROR(
      v.Int(n["sm_threshold"], "policy.sm_threshold", 0, 1u << 24, &p->sm_threshold));
  ORION_RETURN_IF_ERROR(v.Int(n["spin_us"], "policy.spin_us", 0, 10000, &p->spin_us));
  ORION_RETURN_IF_ERROR(
      v.Int(n["hp_stale_ms"], "policy.hp_stale_ms", 10, 600000, &p->hp_stale_ms));
  ORION_RETURN_IF_ERROR(
      v.Int(n["hp_grace_us"], "policy.hp_grace_us", 0, 100000, &p->hp_grace_us));
  ORION_RETURN_IF_ERROR(v.Bool(n["adapt_budget"], "policy.adapt_budget", &p->adapt_budget));
  ORION_RETURN_IF_ERROR(v.Bool(n["gpu_hold"], "policy.gpu_hold", &p->gpu_hold));
  ORION_RETURN_IF_ERROR(v.Int(n["gpu_hold_max_ms"], "policy.gpu_hold_max_ms", 0,
                              contract::kMaxGpuHoldMaxNs / 1000000, &p->gpu_hold_max_ms));
  ORION_RETURN_IF_ERROR(v.Int(n["gpu_hold_release_ms"], "policy.gpu_hold_release_ms", 0,
                              contract::kMaxGpuHoldReleaseNs / 1000000, &p->gpu_hold_release_ms));
  uint64_t target_ms = 0;
  ORION_RETURN_IF_ERROR(v.Int(n["default_latency_target_ms"], "policy.default_latency_target_ms",
                              0, 3600000, &target_ms));
  if (n["default_latency_target_ms"]) p->default_latency_target_us = target_ms * 1000;
  uint64_t floor_ms = p->min_latency_target_us / 1000;
  ORION_RETURN_IF_ERROR(v.Int(n["min_latency_target_ms"], "policy.min_latency_target_ms", 0,
                              60000, &floor_ms));
  p->min_latency_target_us = floor_ms * 1000;
  ORION_RETURN_IF_ERROR(v.Int(n["high_priority_per_gpu"], "policy.high_priority_per_gpu", 1, 64,
                              &p->high_priority_per_gpu));
  if (const YAML::Node ns = n["high_priority_namespaces"]) {
    if (!ns.IsSequence()) {
      return v.Error("policy.high_priority_namespaces", "a list of namespaces", ns);
    }
    for (size_t i = 0; i < ns.size(); ++i) {
      const std::string key = absl::StrCat("policy.high_priority_namespaces[", i, "]");
      std::string name;
      ORION_RETURN_IF_ERROR(v.String(ns[i], key, &name));
      if (name.empty()) return v.Error(key, "a namespace", ns[i]);
      p->high_priority_namespaces.push_back(std::move(name));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseRules(const Validator& v, const YAML::Node& n, ServerConfig* c) {
  if (!n) return absl::OkStatus();
  if (!n.IsMap()) return v.Error("standalone", "a map", n);
  ORION_RETURN_IF_ERROR(v.CheckKeys(n, "standalone", {"trust_client_requests", "rules"}));
  ORION_RETURN_IF_ERROR(v.Bool(n["trust_client_requests"], "standalone.trust_client_requests",
                               &c->trust_client_requests));
  const YAML::Node rules = n["rules"];
  if (!rules) return absl::OkStatus();
  if (!rules.IsSequence()) return v.Error("standalone.rules", "a list of rules", rules);
  for (size_t i = 0; i < rules.size(); ++i) {
    const std::string key = absl::StrCat("standalone.rules[", i, "]");
    const YAML::Node r = rules[i];
    if (!r.IsMap()) return v.Error(key, "a map", r);
    ORION_RETURN_IF_ERROR(
        v.CheckKeys(r, key, {"process", "exe", "uid", "priority", "memory_limit",
                             "latency_target_ms"}));
    PriorityRule rule;
    ORION_RETURN_IF_ERROR(v.String(r["process"], key + ".process", &rule.process_glob));
    ORION_RETURN_IF_ERROR(v.String(r["exe"], key + ".exe", &rule.exe_glob));
    if (r["uid"]) {
      uint32_t uid = 0;
      ORION_RETURN_IF_ERROR(v.Int(r["uid"], key + ".uid", 0, 0xFFFFFFFEu, &uid));
      rule.uid = uid;
    }
    const YAML::Node prio = r["priority"];
    if (!prio) return v.Plain(key, "missing key 'priority' (high or best-effort)");
    if (!prio.IsScalar() || !ParsePriority(prio.Scalar()).ok()) {
      return v.Error(key + ".priority", "high or best-effort", prio);
    }
    rule.priority = *ParsePriority(prio.Scalar());
    ORION_RETURN_IF_ERROR(v.Bytes(r["memory_limit"], key + ".memory_limit",
                                  &rule.memory_limit_bytes));
    uint64_t ms = 0;
    ORION_RETURN_IF_ERROR(v.Int(r["latency_target_ms"], key + ".latency_target_ms", 0, 3600000,
                                &ms));
    rule.latency_target_us = ms * 1000;
    c->rules.push_back(std::move(rule));
  }
  return absl::OkStatus();
}

absl::Status ParseLimits(const Validator& v, const YAML::Node& n, ServerConfig* c) {
  if (!n) return absl::OkStatus();
  if (!n.IsMap()) return v.Error("limits", "a map", n);
  ORION_RETURN_IF_ERROR(v.CheckKeys(
      n, "limits",
      {"clients_per_pod", "clients_per_uid", "pending_connections", "request_timeout_ms",
       "unlisted_gpus"}));
  ORION_RETURN_IF_ERROR(v.Int(n["clients_per_pod"], "limits.clients_per_pod", 0,
                              contract::kMaxSlots, &c->max_clients_per_pod));
  ORION_RETURN_IF_ERROR(v.Int(n["clients_per_uid"], "limits.clients_per_uid", 0,
                              contract::kMaxSlots, &c->max_clients_per_uid));
  ORION_RETURN_IF_ERROR(v.Int(n["pending_connections"], "limits.pending_connections", 1, 4096,
                              &c->max_pending_connections));
  ORION_RETURN_IF_ERROR(v.Int(n["request_timeout_ms"], "limits.request_timeout_ms", 10, 60000,
                              &c->request_timeout_ms));
  ORION_RETURN_IF_ERROR(v.Int(n["unlisted_gpus"], "limits.unlisted_gpus", 0, contract::kMaxGpus,
                              &c->max_unlisted_gpus_per_tenant));
  return absl::OkStatus();
}

std::string DefaultNodeName() {
  if (const char* n = std::getenv("NODE_NAME"); n && *n) return n;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0]) return host;
  return "localhost";
}

}  // namespace

std::string DefaultAgentSocket(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  const std::string dir = slash == std::string::npos || slash == 0
                              ? std::string("/run/orion")
                              : socket_path.substr(0, slash);
  return dir + "-agent/agent.sock";
}

absl::StatusOr<uint64_t> ParseByteSize(const std::string& raw) {
  const std::string text(absl::StripAsciiWhitespace(raw));
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  uint64_t number = 0;
  if (i == 0 || !absl::SimpleAtoi(text.substr(0, i), &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", raw, "' is not a byte size (examples: 8Gi, 512Mi, 1G, 1048576)"));
  }
  const std::string unit = text.substr(i);
  static const struct {
    const char* suffix;
    uint64_t factor;
  } kUnits[] = {{"", 1},
                {"B", 1},
                {"K", 1000ull},
                {"M", 1000ull * 1000},
                {"G", 1000ull * 1000 * 1000},
                {"T", 1000ull * 1000 * 1000 * 1000},
                {"Ki", 1ull << 10},
                {"Mi", 1ull << 20},
                {"Gi", 1ull << 30},
                {"Ti", 1ull << 40}};
  for (const auto& u : kUnits) {
    if (unit == u.suffix) {
      if (number > UINT64_MAX / u.factor) {
        return absl::InvalidArgumentError(absl::StrCat("'", raw, "' is too large"));
      }
      return number * u.factor;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("'", raw, "' has an unknown unit '", unit,
                                                 "' (use Ki, Mi, Gi, Ti, K, M, G, T or none)"));
}

absl::StatusOr<Priority> ParsePriority(const std::string& raw) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(raw));
  if (t == "high") return Priority::kHigh;
  if (t == "best-effort" || t == "besteffort" || t == "best_effort" || t == "low") {
    return Priority::kBestEffort;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", raw, "' is not a priority (expected high or best-effort)"));
}

absl::StatusOr<GateMode> ParseGateMode(const std::string& raw) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(raw));
  if (t == "pass-through" || t == "passthrough") return GateMode::kPassThrough;
  if (t == "priority") return GateMode::kPriority;
  if (t == "mps") return GateMode::kMps;
  return absl::InvalidArgumentError(
      absl::StrCat("'", raw, "' is not a mode (expected pass-through, priority or mps)"));
}

const char* PriorityName(Priority p) { return p == Priority::kHigh ? "high" : "best-effort"; }

const char* GateModeName(GateMode m) {
  switch (m) {
    case GateMode::kPassThrough: return "pass-through";
    case GateMode::kPriority: return "priority";
    case GateMode::kMps: return "mps";
  }
  return "unknown";
}

absl::StatusOr<ServerConfig> ParseServerConfig(const std::string& yaml_text,
                                               const std::string& source_name) {
  ServerConfig c;
  c.source = source_name;
  c.node_name = DefaultNodeName();
  Validator v(source_name);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ":", e.mark.line + 1,
                                                   ": not valid YAML: ", e.msg));
  }
  if (root.IsNull()) {  // empty file: all defaults
    c.agent_socket = DefaultAgentSocket(c.socket_path);
    return c;
  }
  if (!root.IsMap()) return v.Error("(top level)", "a map of settings", root);
  try {
    if (root["board_path"]) {
      return v.Plain("board_path",
                     "is no longer used: the server hands the board to each client over the "
                     "registration socket (no file); remove the key");
    }
    ORION_RETURN_IF_ERROR(v.CheckKeys(
        root, "",
        {"node_name", "socket_path", "admin_address", "admin_auth", "agent_socket",
         "metrics_address", "gpus", "mode", "policy", "standalone", "timeline_spans_per_gpu",
         "request_range_prefix", "hp_latency_window", "kernel_profiles", "limits"}));
    ORION_RETURN_IF_ERROR(v.String(root["node_name"], "node_name", &c.node_name));
    if (c.node_name.empty()) c.node_name = DefaultNodeName();  // "" means the default too
    ORION_RETURN_IF_ERROR(v.String(root["socket_path"], "socket_path", &c.socket_path));
    ORION_RETURN_IF_ERROR(v.String(root["admin_address"], "admin_address", &c.admin_address));
    ORION_RETURN_IF_ERROR(
        v.String(root["metrics_address"], "metrics_address", &c.metrics_address));
    ORION_RETURN_IF_ERROR(v.String(root["agent_socket"], "agent_socket", &c.agent_socket));
    if (const YAML::Node a = root["admin_auth"]) {
      if (!a.IsMap()) return v.Error("admin_auth", "a map such as {tokens_file: PATH}", a);
      ORION_RETURN_IF_ERROR(v.CheckKeys(a, "admin_auth",
                                        {"tokens_file", "tls_cert_file", "tls_key_file",
                                         "client_ca_file", "service_accounts", "kubernetes_api"}));
      ORION_RETURN_IF_ERROR(
          v.String(a["kubernetes_api"], "admin_auth.kubernetes_api", &c.admin_kubernetes_api));
      if (const YAML::Node sa = a["service_accounts"]) {
        if (!sa.IsMap()) {
          return v.Error("admin_auth.service_accounts",
                         "a map such as {operators: [ns/name], readers: [ns/name]}", sa);
        }
        ORION_RETURN_IF_ERROR(
            v.CheckKeys(sa, "admin_auth.service_accounts", {"operators", "readers"}));
        for (const char* role : {"operators", "readers"}) {
          const std::string key = absl::StrCat("admin_auth.service_accounts.", role);
          std::vector<std::string>& out = std::string(role) == "operators"
                                              ? c.admin_service_account_operators
                                              : c.admin_service_account_readers;
          const YAML::Node list = sa[role];
          if (!list) continue;
          if (!list.IsSequence()) return v.Error(key, "a list of namespace/name", list);
          for (size_t i = 0; i < list.size(); ++i) {
            const std::string item_key = absl::StrCat(key, "[", i, "]");
            std::string account;
            ORION_RETURN_IF_ERROR(v.String(list[i], item_key, &account));
            const std::vector<std::string> parts = absl::StrSplit(account, '/');
            if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
              return v.Error(item_key, "namespace/name of a ServiceAccount", list[i]);
            }
            out.push_back(account);
          }
        }
      }
      ORION_RETURN_IF_ERROR(
          v.String(a["tokens_file"], "admin_auth.tokens_file", &c.admin_tokens_file));
      ORION_RETURN_IF_ERROR(
          v.String(a["tls_cert_file"], "admin_auth.tls_cert_file", &c.admin_tls_cert_file));
      ORION_RETURN_IF_ERROR(
          v.String(a["tls_key_file"], "admin_auth.tls_key_file", &c.admin_tls_key_file));
      ORION_RETURN_IF_ERROR(
          v.String(a["client_ca_file"], "admin_auth.client_ca_file", &c.admin_client_ca_file));
      if (c.admin_tls_cert_file.empty() != c.admin_tls_key_file.empty()) {
        return v.Plain("admin_auth",
                       "tls_cert_file and tls_key_file go together (the server's certificate "
                       "chain and its private key, PEM)");
      }
      if (!c.admin_client_ca_file.empty() && c.admin_tls_cert_file.empty()) {
        return v.Plain("admin_auth.client_ca_file",
                       "client certificates need TLS: set tls_cert_file and tls_key_file too");
      }
    }
    if (c.agent_socket.empty()) c.agent_socket = DefaultAgentSocket(c.socket_path);
    for (const char* key : {"socket_path", "agent_socket"}) {
      const std::string& p = std::string(key) == "socket_path" ? c.socket_path : c.agent_socket;
      if (p.empty() || p[0] != '/') return v.Error(key, "an absolute path", root[key]);
      if (p.size() >= 108) return v.Error(key, "a path shorter than 108 bytes", root[key]);
    }
    // socket_path's folder is mounted into pods: AgentSync (pod priorities) there would be
    // reachable by a pod's root.
    const std::string client_dir = c.socket_path.substr(0, c.socket_path.rfind('/') + 1);
    if (c.agent_socket.rfind(client_dir, 0) == 0) {
      return v.Plain("agent_socket",
                     absl::StrCat(c.agent_socket, " is inside ", client_dir,
                                  ", socket_path's folder, which is mounted into pods: AgentSync "
                                  "must be out of their reach (e.g. ",
                                  DefaultAgentSocket(c.socket_path), ")"));
    }
    for (const char* key : {"admin_address", "metrics_address"}) {
      const std::string& a =
          std::string(key) == "admin_address" ? c.admin_address : c.metrics_address;
      if (a.rfind(':') == std::string::npos) {
        return v.Error(key, "HOST:PORT such as 0.0.0.0:50051", root[key]);
      }
    }
    if (const YAML::Node g = root["gpus"]) {
      if (!g.IsSequence()) return v.Error("gpus", "a list of GPU UUIDs", g);
      if (g.size() > contract::kMaxGpus) {
        return v.Plain("gpus", absl::StrCat("at most ", contract::kMaxGpus, " GPUs per node"));
      }
      for (size_t i = 0; i < g.size(); ++i) {
        const std::string key = absl::StrCat("gpus[", i, "]");
        if (!g[i].IsScalar() || g[i].Scalar().rfind("GPU-", 0) != 0 ||
            g[i].Scalar().size() >= contract::kGpuUuidBytes) {
          return v.Error(key, "a GPU UUID such as GPU-8f4c2e1a-...", g[i]);
        }
        c.gpus.push_back(g[i].Scalar());
      }
    }
    if (const YAML::Node kp = root["kernel_profiles"]) {
      if (!kp.IsSequence()) return v.Error("kernel_profiles", "a list of Orion CSV file paths", kp);
      for (size_t i = 0; i < kp.size(); ++i) {
        if (!kp[i].IsScalar() || kp[i].Scalar().empty()) {
          return v.Error(absl::StrCat("kernel_profiles[", i, "]"), "a file path", kp[i]);
        }
        c.kernel_profiles.push_back(kp[i].Scalar());
      }
    }
    ORION_RETURN_IF_ERROR(ParsePolicy(v, root["policy"], root["mode"], &c.policy));
    ORION_RETURN_IF_ERROR(ParseRules(v, root["standalone"], &c));
    ORION_RETURN_IF_ERROR(v.Int(root["timeline_spans_per_gpu"], "timeline_spans_per_gpu", 1000,
                                50000000, &c.timeline_spans_per_gpu));
    ORION_RETURN_IF_ERROR(v.String(root["request_range_prefix"], "request_range_prefix",
                                   &c.request_range_prefix));
    if (c.request_range_prefix.size() > 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name, ": request_range_prefix: at most 64 characters (NVTX names are cut at 79)"));
    }
    ORION_RETURN_IF_ERROR(
        v.Int(root["hp_latency_window"], "hp_latency_window", 100, 1000000, &c.hp_latency_window));
    ORION_RETURN_IF_ERROR(ParseLimits(v, root["limits"], &c));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ":", e.mark.line + 1, ": ", e.msg));
  }
  return c;
}

absl::StatusOr<ServerConfig> LoadServerConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read config file"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseServerConfig(ss.str(), path);
}

const char* DefaultConfigYaml() {
  return R"(# orion-server configuration. Every key is optional; these are the defaults.
# node_name:                           # this node in metrics, exports and the admin API;
                                       # default (left out or ""): $NODE_NAME, else the host name
socket_path: /run/orion/orion.sock     # Unix socket where interposed processes register (and
                                       # receive the board, read-only, and their own areas)
admin_address: 127.0.0.1:50051         # gRPC admin API (health + reflection enabled); loopback
                                       # unless set: another address wants admin_auth too
admin_auth:
  tokens_file: ""                      # "ROLE NAME TOKEN" lines (reader | operator); empty:
                                       # no tokens, every caller may change everything
  tls_cert_file: ""                    # server certificate chain (PEM): the admin API speaks
  tls_key_file: ""                     # TLS when both are set
  client_ca_file: ""                   # CA of client certificates: then every caller must
                                       # present one it signed; its CN is a NAME of the tokens
                                       # file (that line's role) or, without tokens, an operator
  service_accounts:                    # Kubernetes ServiceAccount tokens, checked by TokenReview
    operators: []                      # namespace/name
    readers: []
  kubernetes_api: ""                   # for TokenReview; default: in cluster
agent_socket: ""                       # AgentSync (pod priorities from orion-agent), a Unix
                                       # socket for root only, never in socket_path's folder
                                       # (pods mount it); default: agent.sock in a folder
                                       # beside it, FOLDER-agent (/run/orion-agent)
metrics_address: 0.0.0.0:9464          # Prometheus /metrics
gpus: []                               # GPU UUIDs in board order, the only ones clients may
                                       # use; empty: those found at start, else on demand
                                       # (limits.unlisted_gpus)
mode: priority                         # pass-through | priority | mps
policy:
  # be_budget_us:                      # best-effort GPU time allowed in flight beside HP work;
                                       # default by mode: 500 (priority), 5000 (mps)
  sm_threshold: 0                      # mps mode: max thread blocks of a BE kernel admitted
                                       # beside HP work; 0: no limit (MPS caps BE SMs)
  spin_us: 20                          # spin before blocking at the gate
  hp_stale_ms: 1000                    # HP work older than this no longer holds the gate
  hp_grace_us: 500                     # HP idle this briefly still counts as busy (CPU gaps
                                       # between the kernels of one request)
  adapt_budget: true                   # adapt be_budget_us to the HP latency target, or
                                       # (priority mode, no target, budget not set) to a tenth
                                       # of the HP service's median busy period
  gpu_hold: true                       # priority mode, beside HP clients launching CUDA
                                       # graphs: best-effort launches go at once and wait on
                                       # the GPU while HP work runs (no CPU round trip to
                                       # refill); false: held at the gate on the CPU
  gpu_hold_max_ms: 100                 # the longest the GPU hold lasts while HP clients stay
                                       # busy; past it, best-effort work waits at the gate on
                                       # the CPU for gpu_hold_release_ms and until they are
                                       # idle; 0: no bound
  gpu_hold_release_ms: 30000           # that wait's least time, whether or not the HP clients
                                       # went idle meanwhile (at most 600000); 0: until idle
  default_latency_target_ms: 0         # 0: no target unless a pod/rule sets one
  min_latency_target_ms: 5             # a pod's (or orion-run's) lower target is raised to this
  high_priority_per_gpu: 1             # high-priority pods a GPU may hold; more is flagged
                                       # (orion_gpu_high_priority_pods, ListGpus)
  high_priority_namespaces: []         # namespaces whose pods may be orion/priority: high;
                                       # empty: all. Elsewhere such a pod runs best-effort
standalone:                            # processes not in a Kubernetes pod
  trust_client_requests: true          # honour orion-run --priority/--memory-limit/--job
  rules: []                            # e.g. - {process: "serve*", uid: 1000, priority: high,
                                       #         memory_limit: 8Gi}  (bytes, K/M/G/T powers of
                                       # 1000, Ki/Mi/Gi/Ti powers of 1024; 0: no limit);
                                       # process matches comm (settable by the process) or the
                                       # executable's file name; exe: "/opt/*/tritonserver"
                                       # matches the executable's path, which it cannot change
timeline_spans_per_gpu: 200000         # timeline spans kept per GPU (ring)
request_range_prefix: "request"        # NVTX ranges named so are requests (latency histogram)
hp_latency_window: 2000                # HP busy periods kept per client for tail estimates
kernel_profiles: []                    # Orion profile CSVs (Name,Profile,...) to preload
limits:                                # what one tenant may take of the node
  clients_per_pod: 64                  # client slots (of 256) one pod's processes may hold;
                                       # 0: no cap
  clients_per_uid: 64                  # the same for processes in no pod, per uid (root is
                                       # not counted); 0: no cap
  pending_connections: 128             # connections on socket_path still sending their
                                       # request; at the cap the oldest is closed
  request_timeout_ms: 1000             # a connection whose request is not whole by then is
                                       # closed
  unlisted_gpus: 2                     # with no gpus (none set, none found): GPUs one pod
                                       # (else uid; root not counted) may add; 0: no cap
)";
}

}  // namespace orion::server
