// orion-ctl: admin CLI for orion-server's orion.v1.Admin API.
//   orion-ctl [--server HOST:PORT] [--json] COMMAND ...
// Commands: gpus | clients | jobs | client ID |
//           priority (ID | --pod UID | --job KEY) high|best-effort |
//           pause (ID | --job KEY) | resume (ID | --job KEY) | policy [--gpu N] [KEY=VALUE ...] |
//           timeline [--gpu N] [--last-ms N|--since MS --until MS] [--trace F] [--html F] |
//           timeline merge A.json B.json ... --out F | profile ID [--csv FILE]
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "orion/v1/admin.grpc.pb.h"
#include "tools/trace_export.h"
#include "orion_version.h"

namespace {

using orion::v1::Admin;

void Usage(FILE* out) {
  std::fputs(
      "usage: orion-ctl [--server HOST:PORT] [--token-file FILE] [--cacert CA [--cert CERT\n"
      "                 --key KEY]] [--json] COMMAND\n"
      "  health                                health check, then count GPUs and clients\n"
      "  gpus                                  GPUs of the node and their gate mode\n"
      "  clients [--namespace NS] [--pod P] [--gpu N] [--exited]\n"
      "                                        who is registered; POD is standalone/PROCESS\n"
      "                                        outside Kubernetes; --exited: also the last\n"
      "                                        256 clients that exited\n"
      "  jobs [--namespace NS]                 training jobs: the ranks of one pod, JobSet,\n"
      "                                        PyTorchJob or orion/job in a namespace (KEY\n"
      "                                        NS/NAME), or of one standalone launcher\n"
      "  client ID                             one client in detail\n"
      "  priority ID high|best-effort          change a client's priority now\n"
      "  priority --pod UID high|best-effort   change a pod's priority (current + future)\n"
      "  priority --job KEY high|best-effort   change every rank of a job at once\n"
      "  pause ID | resume ID                  hold / release all launches of a client\n"
      "  pause --job KEY | resume --job KEY    hold / release every rank of a job at once\n"
      "  policy [--gpu N|--all] [KEY=VALUE...] show or set knobs: mode=pass-through|priority|mps,\n"
      "                                        be_budget_us, sm_threshold, spin_us, hp_stale_ms,\n"
      "                                        hp_grace_us, adapt_budget=true|false,\n"
      "                                        gpu_hold=true|false, gpu_hold_max_ms,\n"
      "                                        gpu_hold_release_ms;\n"
      "                                        prints them as KEY=VALUE\n"
      "  timeline [--gpu N] [--last-ms N | --since MS [--until MS]] [--trace F.json] [--html F.html]\n"
      "                                        who ran when (default: GPU 0, last 1000 ms; times in\n"
      "                                        Unix ms). --trace: Chrome trace JSON of every GPU\n"
      "                                        (Perfetto, chrome://tracing); --html: one page;\n"
      "                                        --run-gap-ms N: work closer than N ms merges into\n"
      "                                        one 'ran' row per client (default 1; 0: none)\n"
      "  timeline merge A.json B.json ... --out ALL.json [--html ALL.html]\n"
      "                                        several nodes' exports on one time axis\n"
      "  timeline --from-log DIR --trace F.json [--html F.html]\n"
      "                                        call logs written with ORION_LOG_DIR (no server)\n"
      "  timeline --follow [--gpu N]           print spans as the server records them\n"
      "  recording [--gpu N] [--from MS] [--until MS]   record spans only in this window\n"
      "                                        (Unix ms; 0 or left out: open; operator)\n"
      "  profile ID [--csv FILE]               learned kernel profile; Orion CSV to FILE\n"
      "server default: $ORION_ADMIN or localhost:50051; token (sent as 'authorization: Bearer'):\n"
      "--token-file, else $ORION_TOKEN_FILE (a file holding the token, or a tokens-file line\n"
      "'ROLE NAME TOKEN': its last field is used). TLS: --cacert (the CA of the server's\n"
      "certificate; also $ORION_CACERT), with --cert/--key a client certificate (PEM files)\n",
      out);
}

// Writes a trace's JSON to trace_path and its page to html_path (either may be empty), saying
// "wrote PATH<summary>" for each. Returns the path it could not write, or "".
std::string WriteTraceFiles(const std::string& json, const std::string& trace_path,
                            const std::string& html_path, const std::string& summary) {
  for (const std::string* path : {&trace_path, &html_path}) {
    if (path->empty()) continue;
    std::ofstream out(*path);
    out << (path == &trace_path ? json : orion::tools::TimelineHtml(json));
    if (!out) return *path;
    std::printf("wrote %s%s\n", path->c_str(), summary.c_str());
  }
  return "";
}

// Where the admin address came from, for messages: the user fixes the one that is wrong.
struct AdminAddress {
  std::string address;
  const char* source;  // "from --server", "from $ORION_ADMIN" or "the default"
};

int FailCall(const grpc::Status& s, const AdminAddress& server) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::fprintf(stderr,
                 "orion-ctl: cannot reach orion-server's admin API at %s (%s): %s\n"
                 "  start orion-server, or name its admin_address with --server HOST:PORT or\n"
                 "  $ORION_ADMIN\n",
                 server.address.c_str(), server.source, s.error_message().c_str());
    return 1;
  }
  std::fprintf(stderr, "orion-ctl: error: %s\n", s.error_message().c_str());
  return 1;
}

template <typename M>
void PrintJson(const M& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  std::fputs(out.c_str(), stdout);
}

const char* PrioName(orion::v1::Priority p) {
  return p == orion::v1::PRIORITY_HIGH ? "high" : "best-effort";
}

std::string Mib(uint64_t b) { return b ? std::to_string(b >> 20) + "Mi" : "-"; }

// CPUs the client may use, as it found them ("-": no limit found).
std::string Cpus(uint32_t millicpus) {
  if (millicpus == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%g", millicpus / 1000.0);
  return buf;
}

// Who a client is in one word: its pod, or outside Kubernetes "standalone/PROCESS", the labels
// its metrics carry.
std::string PodOf(const orion::v1::Client& c) {
  if (!c.pod().empty()) return c.namespace_() + "/" + c.pod();
  return "standalone/" + (c.process_name().empty() ? "?" : c.process_name());
}

// "train(4321)": how timeline rows name a client's process; "?" for one the server forgot.
std::string ProcessOf(const std::map<uint32_t, orion::v1::Client>& clients, uint32_t id) {
  auto it = clients.find(id);
  if (it == clients.end()) return "?";
  const orion::v1::Client& c = it->second;
  return absl::StrCat(c.pod().empty() ? c.process_name() : PodOf(c), "(", c.host_pid(), ")",
                      c.exited() ? ",exited" : "");
}

// "0,1": a job's GPUs.
std::string GpuList(const orion::v1::Job& j) {
  std::string out;
  for (uint32_t g : j.gpus()) absl::StrAppend(&out, out.empty() ? "" : ",", g);
  return out.empty() ? "-" : out;
}

void PrintJobRow(const orion::v1::Job& j) {
  const char* prio = j.priority() == orion::v1::PRIORITY_UNSPECIFIED ? "mixed" : PrioName(j.priority());
  std::printf("%-40.40s %-8s %5u %5d %-12s %-6s %10s %10.3f %10.3f\n", j.key().c_str(),
              GpuList(j).c_str(), j.ranks(), j.pods_size(), prio, j.paused() ? "yes" : "no",
              Mib(j.memory_used_bytes()).c_str(), j.held_seconds(), j.busy_seconds());
}

// A best-effort job whose ranks meet services on two GPUs or more: what it costs them, and what
// helps (docs/design.md, "Multi-GPU jobs").
void PrintJobBesideServicesNote(const orion::v1::Job& j) {
  if (j.gpus_beside_services() < 2) return;
  std::printf(
      "note: %s has best-effort ranks beside high-priority services on %u GPUs: a rank's "
      "collective spins on its GPU while a peer is held for another GPU's service (services' "
      "p99 about 4x in priority mode); give it at most one GPU with a service, or run the GPUs "
      "in mps mode\n",
      j.key().c_str(), j.gpus_beside_services());
}

void PrintClientRow(const orion::v1::Client& c) {
  std::printf("%-5u %-4u %-8u %-20.20s %-24.24s %-12s %-6s %5s %10s %10s %12lu %10.3f\n",
              c.client_id(), c.gpu(), c.host_pid(), c.process_name().c_str(), PodOf(c).c_str(),
              PrioName(c.priority()), c.exited() ? "exited" : c.paused() ? "yes" : "no",
              Cpus(c.usable_millicpus()).c_str(),
              Mib(c.memory_used_bytes()).c_str(), Mib(c.memory_limit_bytes()).c_str(),
              static_cast<unsigned long>(c.kernels_launched()), c.throttled_ns() / 1e9);
}

// The knobs `policy` takes as KEY=VALUE are PolicyKnobs' fields, in admin.proto's order, which
// is the order it prints them in: a knob added there is known here.
const google::protobuf::FieldDescriptor* Knob(const std::string& key) {
  return orion::v1::PolicyKnobs::descriptor()->FindFieldByName(key);
}

std::string KnobNames() {
  const google::protobuf::Descriptor* d = orion::v1::PolicyKnobs::descriptor();
  std::string names;
  for (int i = 0; i < d->field_count(); ++i) {
    absl::StrAppend(&names, i == 0 ? "" : ", ", d->field(i)->name());
  }
  return names;
}

// A GPU's knobs in the KEY=VALUE form `policy` accepts, one a line.
void PrintKnobs(const orion::v1::PolicyKnobs& k) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = k.GetReflection();
  const google::protobuf::Descriptor* d = k.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    std::string value;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_ENUM:  // mode, the only enum
        value = k.mode() == orion::v1::GATE_MODE_PASS_THROUGH ? "pass-through"
                : k.mode() == orion::v1::GATE_MODE_MPS        ? "mps"
                                                              : "priority";
        break;
      case FieldDescriptor::CPPTYPE_BOOL: value = r->GetBool(k, f) ? "true" : "false"; break;
      case FieldDescriptor::CPPTYPE_UINT32: value = std::to_string(r->GetUInt32(k, f)); break;
      case FieldDescriptor::CPPTYPE_UINT64: value = std::to_string(r->GetUInt64(k, f)); break;
      default: value = "?"; break;
    }
    std::printf("%s=%s\n", f->name().c_str(), value.c_str());
  }
}

bool ParseU32(const std::string& s, uint32_t* out) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(s.c_str(), &end, 10);
  if (s.empty() || *end || v > 0xFFFFFFFFul) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  AdminAddress admin{"localhost:50051", "the default"};
  if (const char* env = std::getenv("ORION_ADMIN"); env != nullptr && *env != '\0') {
    admin = {env, "from $ORION_ADMIN"};
  }
  bool json = false;
  std::string token_file = std::getenv("ORION_TOKEN_FILE") ? std::getenv("ORION_TOKEN_FILE") : "";
  std::string cacert_file = std::getenv("ORION_CACERT") ? std::getenv("ORION_CACERT") : "";
  std::string cert_file, key_file;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--server" && i + 1 < argc) {
      admin = {argv[++i], "from --server"};
    } else if (a == "--token-file" && i + 1 < argc) {
      token_file = argv[++i];
    } else if (a == "--cacert" && i + 1 < argc) {
      cacert_file = argv[++i];
    } else if (a == "--cert" && i + 1 < argc) {
      cert_file = argv[++i];
    } else if (a == "--key" && i + 1 < argc) {
      key_file = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "--version") {
      std::printf("%s %s\n", "orion-ctl", ORION_VERSION_LINE);
      return 0;
    } else if (a == "-h" || a == "--help") {
      Usage(stdout);
      return 0;
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) {
    Usage(stderr);
    return 2;
  }
  std::string token;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    std::string line;
    // The first non-comment line; its last field (a bare token, or ROLE NAME TOKEN).
    while (token.empty() && std::getline(in, line)) {
      std::istringstream fields(line.substr(0, line.find('#')));
      for (std::string f; fields >> f;) token = f;
    }
    if (token.empty()) {
      std::fprintf(stderr, "orion-ctl: %s: no token in it (or not readable)\n",
                   token_file.c_str());
      return 2;
    }
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!cacert_file.empty() || !cert_file.empty() || !key_file.empty()) {
    if (cacert_file.empty() || cert_file.empty() != key_file.empty()) {
      std::fprintf(stderr, "orion-ctl: TLS needs --cacert, and --cert with --key (or neither)\n");
      return 2;
    }
    grpc::SslCredentialsOptions tls;
    for (auto [path, out] : {std::pair{&cacert_file, &tls.pem_root_certs},
                             std::pair{&cert_file, &tls.pem_cert_chain},
                             std::pair{&key_file, &tls.pem_private_key}}) {
      if (path->empty()) continue;
      std::ifstream in(*path);
      std::stringstream pem;
      pem << in.rdbuf();
      if (!in || pem.str().find("-----BEGIN ") == std::string::npos) {
        std::fprintf(stderr, "orion-ctl: %s: not a readable PEM file\n", path->c_str());
        return 2;
      }
      *out = pem.str();
    }
    credentials = grpc::SslCredentials(tls);
  }
  // A timeline export of a busy GPU is tens of megabytes (200,000 spans); gRPC's default cap on
  // a received message is 4 MiB.
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  const std::string& server = admin.address;
  auto stub = Admin::NewStub(grpc::CreateCustomChannel(server, credentials, channel_args));
  const auto Fail = [&admin](const grpc::Status& s) { return FailCall(s, admin); };
  auto ctx = [&token] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    return c;
  };
  // Every client the server knows, those that exited too, by id: how timeline rows name their
  // processes (ProcessOf).
  auto every_client = [&](std::map<uint32_t, orion::v1::Client>* out) {
    orion::v1::ListClientsRequest every;
    every.set_include_exited(true);
    orion::v1::ListClientsResponse r;
    const grpc::Status status = stub->ListClients(ctx().get(), every, &r);
    for (const auto& c : r.clients()) (*out)[c.client_id()] = c;
    return status;
  };
  const std::string cmd = args[0];
  auto bad = [&](const std::string& why) {
    std::fprintf(stderr, "orion-ctl %s: %s\n", cmd.c_str(), why.c_str());
    return 2;
  };
  // A flag's value: "" with *error set (the flag, the value and the form expected) when it is
  // missing or does not parse; parse is null for free text.
  std::string flag_error;
  auto flag_value = [&](size_t* i, const char* form, const std::function<bool(const std::string&)>&
                                                         parse) -> bool {
    const std::string& flag = args[*i];
    if (*i + 1 >= args.size()) {
      flag_error = flag + " needs a value: " + form;
      return false;
    }
    const std::string& text = args[++*i];
    if (parse && !parse(text)) {
      flag_error = flag + ": expected " + form + ", got '" + text + "'";
      return false;
    }
    return true;
  };

  if (cmd == "health") {
    // grpc.health.v1.Health/Check (no token needed) without its generated code: an empty
    // request, and a response whose field 1 (status) is 1 (SERVING): bytes 08 01.
    auto channel = grpc::CreateChannel(server, credentials);
    const grpc::internal::RpcMethod check("/grpc.health.v1.Health/Check",
                                          grpc::internal::RpcMethod::NORMAL_RPC, channel);
    grpc::Slice empty_message(std::string{});
    grpc::ByteBuffer request(&empty_message, 1), response;
    auto c = ctx();
    grpc::Status hs = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel.get(), check, c.get(), request, &response);
    if (!hs.ok()) return Fail(hs);
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (response.Dump(&slices).ok()) {
      for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    if (bytes != std::string("\x08\x01", 2)) {
      std::fprintf(stderr, "orion-ctl health: the server is not SERVING\n");
      return 1;
    }
    orion::v1::ListGpusResponse gpus;
    if (auto s = stub->ListGpus(ctx().get(), {}, &gpus); !s.ok()) return Fail(s);
    orion::v1::ListClientsResponse clients;
    if (auto s = stub->ListClients(ctx().get(), {}, &clients); !s.ok()) return Fail(s);
    std::printf("SERVING: %d GPU(s), %d client(s)\n", gpus.gpus_size(), clients.clients_size());
    return 0;
  }
  if (cmd == "gpus") {
    orion::v1::ListGpusResponse r;
    if (auto s = stub->ListGpus(ctx().get(), {}, &r); !s.ok()) return Fail(s);
    if (json) return PrintJson(r), 0;
    // HP-PODS: high-priority pods on the GPU / how many it may hold; "!" when over (a pod
    // changed to high at run time beside another: the two wait for each other).
    std::printf("%-5s %-42s %-13s %-8s %-4s %-8s %s\n", "GPU", "UUID", "MODE", "CLIENTS", "HP",
                "HP-BUSY", "HP-PODS");
    for (const auto& g : r.gpus()) {
      const std::string hp_pods = std::to_string(g.high_priority_pods()) + "/" +
                                  std::to_string(g.high_priority_pods_allowed()) +
                                  (g.high_priority_overcommitted() ? " !" : "");
      std::printf("%-5u %-42s %-13s %-8u %-4u %-8s %s\n", g.index(), g.uuid().c_str(),
                  orion::v1::GateMode_Name(g.mode()).c_str() + 10, g.clients(),
                  g.high_priority_clients(), g.high_priority_busy() ? "yes" : "no",
                  hp_pods.c_str());
    }
    return 0;
  }
  if (cmd == "clients") {
    orion::v1::ListClientsRequest q;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--namespace" && i + 1 < args.size()) {
        q.set_namespace_(args[++i]);
      } else if (args[i] == "--pod" && i + 1 < args.size()) {
        q.set_pod(args[++i]);
      } else if (args[i] == "--exited") {
        q.set_include_exited(true);
      } else if (args[i] == "--gpu" && i + 1 < args.size()) {
        uint32_t g = 0;
        if (!ParseU32(args[++i], &g)) {
          return bad("--gpu: expected a GPU index, e.g. 0 (orion-ctl gpus), got '" + args[i] + "'");
        }
        q.set_has_gpu_filter(true);
        q.set_gpu(g);
      } else {
        return bad("unknown argument '" + args[i] + "'");
      }
    }
    orion::v1::ListClientsResponse r;
    if (auto s = stub->ListClients(ctx().get(), q, &r); !s.ok()) return Fail(s);
    if (json) return PrintJson(r), 0;
    if (r.clients_size() == 0) {
      std::printf("(no clients: a process appears here when it registers, e.g. through "
                  "orion-run; --exited lists those that have gone)\n");
      return 0;
    }
    std::printf("%-5s %-4s %-8s %-20s %-24s %-12s %-6s %5s %10s %10s %12s %10s\n", "ID", "GPU",
                "PID", "PROCESS", "POD", "PRIORITY", "PAUSE", "CPUS", "MEM", "LIMIT", "KERNELS",
                "THROTTLE_S");
    for (const auto& c : r.clients()) PrintClientRow(c);
    return 0;
  }
  if (cmd == "jobs") {
    orion::v1::ListJobsRequest q;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--namespace" && i + 1 < args.size()) {
        q.set_namespace_(args[++i]);
      } else {
        return bad("unknown argument '" + args[i] + "'");
      }
    }
    orion::v1::ListJobsResponse r;
    if (auto s = stub->ListJobs(ctx().get(), q, &r); !s.ok()) return Fail(s);
    if (json) return PrintJson(r), 0;
    if (r.jobs_size() == 0) {
      std::printf("(no jobs: a job appears here when its first rank registers)\n");
      return 0;
    }
    std::printf("%-40s %-8s %5s %5s %-12s %-6s %10s %10s %10s\n", "JOB", "GPUS", "RANKS", "PODS",
                "PRIORITY", "PAUSE", "MEM", "HELD_S", "BUSY_S");
    for (const auto& j : r.jobs()) PrintJobRow(j);
    for (const auto& j : r.jobs()) PrintJobBesideServicesNote(j);
    return 0;
  }
  if ((cmd == "pause" || cmd == "resume") && args.size() >= 2 && args[1] == "--job") {
    if (args.size() != 3) return bad("expected: " + cmd + " --job KEY (orion-ctl jobs)");
    orion::v1::JobRequest q;
    q.set_job(args[2]);
    orion::v1::Job j;
    const grpc::Status s = cmd == "pause" ? stub->PauseJob(ctx().get(), q, &j)
                                          : stub->ResumeJob(ctx().get(), q, &j);
    if (!s.ok()) return Fail(s);
    if (json) return PrintJson(j), 0;
    std::printf("job %s: %u rank(s) on GPU %s %s\n", j.key().c_str(), j.ranks(),
                GpuList(j).c_str(), j.paused() ? "paused" : "resumed");
    return 0;
  }
  if (cmd == "client" || cmd == "pause" || cmd == "resume") {
    uint32_t id = 0;
    if (args.size() != 2 || !ParseU32(args[1], &id)) return bad("expected one client id");
    orion::v1::Client c;
    grpc::Status s;
    if (cmd == "client") {
      orion::v1::GetClientRequest q;
      q.set_client_id(id);
      s = stub->GetClient(ctx().get(), q, &c);
    } else if (cmd == "pause") {
      orion::v1::PauseRequest q;
      q.set_client_id(id);
      s = stub->PauseClient(ctx().get(), q, &c);
    } else {
      orion::v1::ResumeRequest q;
      q.set_client_id(id);
      s = stub->ResumeClient(ctx().get(), q, &c);
    }
    if (!s.ok()) return Fail(s);
    PrintJson(c);
    return 0;
  }
  if (cmd == "priority") {
    orion::v1::SetPriorityRequest q;
    std::string level;
    if (args.size() == 4 && args[1] == "--pod") {
      q.set_pod_uid(args[2]);
      level = args[3];
    } else if (args.size() == 4 && args[1] == "--job") {
      q.set_job(args[2]);
      level = args[3];
    } else if (args.size() == 3) {
      uint32_t id = 0;
      if (!ParseU32(args[1], &id)) return bad("expected a client id, --pod UID or --job KEY");
      q.set_client_id(id);
      level = args[2];
    } else {
      return bad("expected: priority ID high|best-effort, priority --pod UID high|best-effort "
                 "or priority --job KEY high|best-effort");
    }
    if (level == "high") {
      q.set_priority(orion::v1::PRIORITY_HIGH);
    } else if (level == "best-effort") {
      q.set_priority(orion::v1::PRIORITY_BEST_EFFORT);
    } else {
      return bad("priority must be high or best-effort, got '" + level + "'");
    }
    orion::v1::SetPriorityResponse r;
    if (auto s = stub->SetPriority(ctx().get(), q, &r); !s.ok()) return Fail(s);
    if (json) return PrintJson(r), 0;
    std::printf("%d client(s) now %s\n", r.clients_size(), level.c_str());
    return 0;
  }
  if (cmd == "policy") {
    orion::v1::SetPolicyRequest q;
    bool set = false;
    for (size_t i = 1; i < args.size(); ++i) {
      uint32_t v = 0;
      if (args[i] == "--gpu" && i + 1 < args.size()) {
        if (!ParseU32(args[++i], &v)) {
          return bad("--gpu: expected a GPU index, e.g. 0 (orion-ctl gpus), got '" + args[i] + "'");
        }
        q.set_gpu(v);
        continue;
      }
      if (args[i] == "--all") {
        q.set_all_gpus(true);
        continue;
      }
      const size_t eq = args[i].find('=');
      if (eq == std::string::npos) {
        return bad("expected KEY=VALUE (e.g. be_budget_us=500), got '" + args[i] +
                   "'; the knobs: " + KnobNames());
      }
      const std::string key = args[i].substr(0, eq), val = args[i].substr(eq + 1);
      set = true;
      q.add_fields(key);
      auto* k = q.mutable_knobs();
      const google::protobuf::FieldDescriptor* f = Knob(key);
      using google::protobuf::FieldDescriptor;
      if (f == nullptr) return bad("unknown knob '" + key + "'; the knobs: " + KnobNames());
      if (key == "mode") {
        if (val == "pass-through") k->set_mode(orion::v1::GATE_MODE_PASS_THROUGH);
        else if (val == "priority") k->set_mode(orion::v1::GATE_MODE_PRIORITY);
        else if (val == "mps") k->set_mode(orion::v1::GATE_MODE_MPS);
        else return bad("mode: expected pass-through, priority or mps, got '" + val + "'");
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
        if (val != "true" && val != "false") {
          return bad(key + ": expected true or false, got '" + val + "'");
        }
        k->GetReflection()->SetBool(k, f, val == "true");
      } else if (!ParseU32(val, &v)) {
        return bad(key + ": expected a whole number (0 or more), got '" + val + "'");
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
        k->GetReflection()->SetUInt64(k, f, v);
      } else {
        k->GetReflection()->SetUInt32(k, f, v);
      }
    }
    orion::v1::PolicyKnobs r;
    grpc::Status s;
    if (set) {
      s = stub->SetPolicy(ctx().get(), q, &r);
    } else {
      orion::v1::GetPolicyRequest g;
      g.set_gpu(q.gpu());
      s = stub->GetPolicy(ctx().get(), g, &r);
    }
    if (!s.ok()) return Fail(s);
    if (json) return PrintJson(r), 0;
    PrintKnobs(r);
    return 0;
  }
  if (cmd == "timeline" && args.size() >= 2 && args[1] == "--from-log") {
    // timeline --from-log DIR --trace F.json [--html F.html]: call logs, no server needed.
    std::string dir, trace_path, html_path;
    uint32_t run_gap_ms = 1;
    for (size_t i = 2; i < args.size(); ++i) {
      if (args[i] == "--run-gap-ms" && i + 1 < args.size() && ParseU32(args[i + 1], &run_gap_ms)) {
        ++i;
      } else if (args[i] == "--trace" && i + 1 < args.size()) {
        trace_path = args[++i];
      } else if (args[i] == "--html" && i + 1 < args.size()) {
        html_path = args[++i];
      } else if (dir.empty()) {
        dir = args[i];
      } else {
        return bad("unknown argument '" + args[i] + "'");
      }
    }
    if (dir.empty() || (trace_path.empty() && html_path.empty())) {
      return bad("expected: timeline --from-log DIR --trace F.json [--html F.html]");
    }
    absl::StatusOr<orion::tools::NodeTimeline> t = orion::tools::NodeTimelineFromCallLogs(dir);
    if (!t.ok()) return bad(std::string(t.status().message()));
    t->run_gap_ns = static_cast<uint64_t>(run_gap_ms) * 1000000;
    const std::string failed = WriteTraceFiles(
        orion::tools::ChromeTraceJson(*t), trace_path, html_path,
        absl::StrCat(": ", t->gpus.front().spans.size(), " calls of ", t->clients.size(),
                     " process(es)"));
    return failed.empty() ? 0 : bad("cannot write " + failed);
  }
  if (cmd == "timeline" && args.size() >= 2 && args[1] == "merge") {
    // timeline merge A.json B.json ... --out ALL.json [--html ALL.html]: no server needed.
    std::vector<std::pair<std::string, std::string>> inputs;
    std::string out_path, html_path;
    for (size_t i = 2; i < args.size(); ++i) {
      if (args[i] == "--out" && i + 1 < args.size()) {
        out_path = args[++i];
      } else if (args[i] == "--html" && i + 1 < args.size()) {
        html_path = args[++i];
      } else {
        std::ifstream in(args[i]);
        if (!in) return bad("cannot read " + args[i]);
        std::stringstream text;
        text << in.rdbuf();
        inputs.emplace_back(args[i], text.str());
      }
    }
    if (inputs.empty() || (out_path.empty() && html_path.empty())) {
      return bad("expected: timeline merge A.json B.json ... --out ALL.json [--html ALL.html]");
    }
    absl::StatusOr<std::string> merged = orion::tools::MergeChromeTraces(inputs);
    if (!merged.ok()) return bad(std::string(merged.status().message()));
    const std::string failed = WriteTraceFiles(
        *merged, out_path, html_path, absl::StrCat(" (", inputs.size(), " exports merged)"));
    return failed.empty() ? 0 : bad("cannot write " + failed);
  }
  if (cmd == "timeline" && args.size() >= 2 && args[1] == "--follow") {
    // timeline --follow [--gpu N]: every new span as the server records it, until interrupted.
    orion::v1::StreamTimelineRequest q;
    q.set_follow(true);
    q.set_cursor(UINT64_MAX);  // from now (the server clamps a cursor ahead of it)
    for (size_t i = 2; i < args.size(); ++i) {
      uint32_t v = 0;
      if (args[i] == "--gpu" && i + 1 < args.size() && ParseU32(args[i + 1], &v)) {
        q.set_gpu(v);
        ++i;
      } else {
        return bad("unknown argument '" + args[i] + "'");
      }
    }
    grpc::ClientContext c;  // no deadline: follows until interrupted
    if (!token.empty()) c.AddMetadata("authorization", "Bearer " + token);
    auto reader = stub->StreamTimeline(&c, q);
    // Rows name each client's process as `timeline` does; the clients are listed again when a
    // span names one not seen yet, at most once a second.
    std::map<uint32_t, orion::v1::Client> clients;
    auto listed = std::chrono::steady_clock::time_point{};
    auto process_of = [&](uint32_t id) {
      const auto now = std::chrono::steady_clock::now();
      if (!clients.count(id) && now - listed >= std::chrono::seconds(1)) {
        listed = now;
        every_client(&clients);  // unanswered: the row reads "?" until the next look
      }
      return ProcessOf(clients, id);
    };
    orion::v1::TimelineChunk chunk;
    while (reader->Read(&chunk)) {
      if (chunk.lost() > 0) std::printf("(%llu spans lost: read too slowly)\n",
                                        static_cast<unsigned long long>(chunk.lost()));
      for (const auto& sp : chunk.spans()) {
        std::printf("%.6f client=%u %-20s %-11s %-9s dur_us=%.1f %s\n", sp.start_unix_ns() / 1e9,
                    sp.client_id(), process_of(sp.client_id()).c_str(), PrioName(sp.priority()),
                    sp.kind().c_str(), sp.duration_ns() / 1e3, sp.name().c_str());
      }
      std::fflush(stdout);
    }
    if (auto s = reader->Finish(); !s.ok()) return Fail(s);
    return 0;
  }
  if (cmd == "recording") {
    // recording [--gpu N] [--from MS] [--until MS]: record spans only inside the window.
    orion::v1::RecordingRequest q;
    q.set_all_gpus(true);
    for (size_t i = 1; i < args.size(); ++i) {
      uint32_t v = 0;
      const bool has_value = i + 1 < args.size();
      if (args[i] == "--gpu" && has_value && ParseU32(args[i + 1], &v)) {
        q.set_all_gpus(false);
        q.set_gpu(v);
        ++i;
      } else if ((args[i] == "--from" || args[i] == "--until") && has_value) {
        char* end = nullptr;
        const long long ms = std::strtoll(args[i + 1].c_str(), &end, 10);
        if (end == args[i + 1].c_str() || *end != 0 || ms < 0) {
          return bad(args[i] + " needs Unix milliseconds (0: open)");
        }
        if (args[i] == "--from") q.set_from_unix_ms(ms); else q.set_until_unix_ms(ms);
        ++i;
      } else {
        return bad("unknown argument '" + args[i] + "'");
      }
    }
    orion::v1::RecordingState r;
    if (auto s = stub->SetRecording(ctx().get(), q, &r); !s.ok()) return Fail(s);
    PrintJson(r);
    return 0;
  }
  if (cmd == "timeline") {
    // Window: --last-ms N (default 1000), or --since/--until in Unix milliseconds.
    uint32_t last_ms = 1000;
    int64_t since_ms = -1, until_ms = 0;
    int64_t gpu = -1;
    uint32_t run_gap_ms = 1;
    std::string trace_path, html_path;
    auto parse_ms = [](const std::string& text, int64_t* out) {
      char* end = nullptr;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (end == text.c_str() || *end != 0 || v < 0) return false;
      *out = v;
      return true;
    };
    constexpr char kMs[] = "a whole number of milliseconds, e.g. 60000";
    constexpr char kUnixMs[] = "Unix milliseconds, e.g. 1767225600000";
    for (size_t i = 1; i < args.size(); ++i) {
      uint32_t v = 0;
      const std::string& a = args[i];
      bool ok = true;
      if (a == "--gpu") {
        ok = flag_value(&i, "a GPU index, e.g. 0 (orion-ctl gpus)",
                        [&](const std::string& t) { return ParseU32(t, &v); });
        gpu = v;
      } else if (a == "--last-ms") {
        ok = flag_value(&i, kMs, [&](const std::string& t) { return ParseU32(t, &last_ms); });
      } else if (a == "--run-gap-ms") {
        ok = flag_value(&i, kMs, [&](const std::string& t) { return ParseU32(t, &run_gap_ms); });
      } else if (a == "--since") {
        ok = flag_value(&i, kUnixMs, [&](const std::string& t) { return parse_ms(t, &since_ms); });
      } else if (a == "--until") {
        ok = flag_value(&i, kUnixMs, [&](const std::string& t) { return parse_ms(t, &until_ms); });
      } else if (a == "--trace" || a == "--html") {
        ok = flag_value(&i, "a file name", nullptr);
        if (ok) (a == "--trace" ? trace_path : html_path) = args[i];
      } else {
        return bad("unknown argument '" + a + "' (see --help)");
      }
      if (!ok) return bad(flag_error);
    }
    const auto unix_ns = [] {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
    const bool since_given = since_ms >= 0;
    if (!since_given) since_ms = unix_ns() / 1000000 - last_ms;
    if (until_ms != 0 && until_ms < since_ms) return bad("--until is before --since");
    const bool export_mode = !trace_path.empty() || !html_path.empty();

    orion::v1::ListGpusResponse gpus;
    if (auto s = stub->ListGpus(ctx().get(), {}, &gpus); !s.ok()) return Fail(s);
    orion::tools::NodeTimeline t;
    t.run_gap_ns = static_cast<uint64_t>(run_gap_ms) * 1000000;
    t.since_unix_ns = since_ms * 1000000;
    t.until_unix_ns = until_ms * 1000000;
    orion::v1::TimelineResponse first;
    for (const orion::v1::Gpu& g : gpus.gpus()) {
      if (gpu >= 0 && g.index() != gpu) continue;
      if (gpu < 0 && !export_mode && g.index() != 0) continue;  // text: GPU 0 unless --gpu
      if (t.node.empty()) t.node = g.node();
      orion::v1::TimelineRequest q;
      q.set_gpu(g.index());
      q.set_since_unix_ms(since_ms);
      q.set_until_unix_ms(until_ms);
      if (export_mode) q.set_max_spans(200000);  // a file, not a screen: take the window whole
      orion::v1::TimelineResponse r;
      if (t.gpus.empty() && export_mode) {
        // The node's clock against ours: the quickest of three tiny calls (no spans to carry),
        // the server's stamp against the middle of the round trip; half of it is the uncertainty.
        orion::v1::TimelineRequest probe;
        probe.set_gpu(g.index());
        probe.set_since_unix_ms(unix_ns() / 1000000 + 60000);  // a window with nothing in it
        for (int i = 0; i < 3; ++i) {
          orion::v1::TimelineResponse pr;
          const int64_t sent = unix_ns();
          if (auto s = stub->GetTimeline(ctx().get(), probe, &pr); !s.ok()) return Fail(s);
          const int64_t received = unix_ns();
          if (pr.server_now_unix_ns() != 0 &&
              (i == 0 || (received - sent) / 2 < t.clock_uncertainty_ns)) {
            t.clock_offset_ns = pr.server_now_unix_ns() - sent / 2 - received / 2;
            t.clock_uncertainty_ns = (received - sent) / 2;
          }
        }
      }
      if (auto s = stub->GetTimeline(ctx().get(), q, &r); !s.ok()) return Fail(s);
      if (t.gpus.empty()) first = r;
      t.gpus.push_back({g, {r.spans().begin(), r.spans().end()}, r.truncated()});
    }
    if (gpus.gpus_size() == 0) {
      return bad("this node knows no GPU yet: a GPU appears when the first process using it "
                 "registers (orion-run ... or a pod)");
    }
    if (t.gpus.empty()) {
      return bad("no GPU " + std::to_string(gpu) + " on this node; it has " +
                 std::to_string(gpus.gpus_size()) + " (orion-ctl gpus)");
    }
    // The clients, those that exited too: rows name each by its process (or pod) and PID.
    if (auto s = every_client(&t.clients); !s.ok()) return Fail(s);
    if (!export_mode) {
      if (json) return PrintJson(first), 0;
      for (const auto& sp : first.spans()) {
        std::printf("%.6f client=%u %-20s %-11s %-9s dur_us=%.1f %s\n", sp.start_unix_ns() / 1e9,
                    sp.client_id(), ProcessOf(t.clients, sp.client_id()).c_str(),
                    PrioName(sp.priority()), sp.kind().c_str(), sp.duration_ns() / 1e3,
                    sp.name().c_str());
      }
      const std::string window =
          since_given ? "in that window" : "in the last " + std::to_string(last_ms) + " ms";
      if (first.spans_size() == 0) {
        std::printf("(no spans on GPU %u %s: widen it with --last-ms N or --since MS)\n",
                    t.gpus.front().gpu.index(), window.c_str());
      } else if (first.truncated()) {
        std::printf("(truncated: the newest %d spans %s are shown, the older ones left out; "
                    "--trace F.json exports the whole window, or narrow it with --since MS "
                    "--until MS)\n",
                    first.spans_size(), window.c_str());
      }
      return 0;
    }
    t.exported_unix_ns = unix_ns();
    size_t spans = 0;
    for (const auto& g : t.gpus) spans += g.spans.size();
    const std::string failed = WriteTraceFiles(
        orion::tools::ChromeTraceJson(t), trace_path, html_path,
        absl::StrCat(": ", spans, " spans of ", t.gpus.size(), " GPU(s) of node ", t.node));
    return failed.empty() ? 0 : bad("cannot write " + failed);
  }
  if (cmd == "profile") {
    uint32_t id = 0;
    if (args.size() < 2 || !ParseU32(args[1], &id)) return bad("expected a client id");
    std::string csv_path;
    if (args.size() == 4 && args[2] == "--csv") csv_path = args[3];
    else if (args.size() != 2) return bad("expected: profile ID [--csv FILE]");
    orion::v1::KernelProfileRequest q;
    q.set_client_id(id);
    orion::v1::KernelProfileResponse r;
    if (auto s = stub->GetKernelProfile(ctx().get(), q, &r); !s.ok()) return Fail(s);
    if (!csv_path.empty()) {
      std::ofstream out(csv_path);
      out << r.orion_csv();
      if (!out) return bad("cannot write " + csv_path);
      std::printf("wrote %d kernels to %s (Orion format)\n", r.kernels_size(), csv_path.c_str());
      return 0;
    }
    if (json) return PrintJson(r), 0;
    std::printf("%-10s %-8s %-10s %-10s %-7s %-8s %s\n", "LAUNCHES", "SAMPLES", "MEAN_US",
                "P99_US", "BLOCKS", "CLASS", "NAME");
    for (const auto& k : r.kernels()) {
      std::printf("%-10lu %-8lu %-10.1f %-10.1f %-7u %-8s %s\n",
                  static_cast<unsigned long>(k.launches()), static_cast<unsigned long>(k.samples()),
                  k.mean_duration_us(), k.p99_duration_us(), k.max_blocks(), k.kind().c_str(),
                  k.name().c_str());
    }
    return 0;
  }
  std::fprintf(stderr, "orion-ctl: unknown command '%s'\n", cmd.c_str());
  Usage(stderr);
  return 2;
}
