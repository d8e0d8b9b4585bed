// The gRPC adapter's mapping: what only the wire can get wrong (unknown knob names, unset enums)
// is refused with the field named, the named fields and no others become a PolicyChange, and the
// views come back out as the messages orion-ctl and grpcurl read.
#include "server/admin_mapping.h"

#include <gtest/gtest.h>

namespace orion::server {
namespace {

TEST(AdminMappingTest, PolicyChangeCarriesOnlyTheNamedFields) {
  orion::v1::SetPolicyRequest r;
  r.set_gpu(3);
  r.add_fields("be_budget_us");
  r.add_fields("mode");
  r.mutable_knobs()->set_be_budget_us(250);
  r.mutable_knobs()->set_mode(orion::v1::GATE_MODE_MPS);
  r.mutable_knobs()->set_hp_grace_us(7);  // not named: not applied
  r.mutable_knobs()->set_adapt_budget(true);  // not named either
  const absl::StatusOr<PolicyChange> c = PolicyChangeFromProto(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu, 3u);
  EXPECT_FALSE(c->all_gpus);
  EXPECT_EQ(c->be_budget_us, 250u);
  EXPECT_EQ(c->mode, contract::GateMode::kMps);
  EXPECT_FALSE(c->hp_grace_us.has_value());
  EXPECT_FALSE(c->adapt_budget.has_value());

  r.add_fields("adapt_budget");
  const absl::StatusOr<PolicyChange> d = PolicyChangeFromProto(r);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->adapt_budget, true);
  EXPECT_FALSE(d->gpu_hold_max_ms.has_value());

  r.add_fields("gpu_hold_max_ms");  // named at 0: no bound, which must arrive as 0
  const absl::StatusOr<PolicyChange> e = PolicyChangeFromProto(r);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->gpu_hold_max_ms, 0u);
  EXPECT_FALSE(e->gpu_hold_release_ms.has_value());

  r.add_fields("gpu_hold_release_ms");  // likewise: 0 is a release until idle
  const absl::StatusOr<PolicyChange> f = PolicyChangeFromProto(r);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->gpu_hold_release_ms, 0u);
}

TEST(AdminMappingTest, NoFieldsMeansEveryFieldAndTheModeMustThenBeSet) {
  orion::v1::SetPolicyRequest r;
  r.set_all_gpus(true);
  const absl::StatusOr<PolicyChange> unset = PolicyChangeFromProto(r);
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.status().message().find("knobs.mode is unset"), std::string::npos);

  r.mutable_knobs()->set_mode(orion::v1::GATE_MODE_PRIORITY);
  r.mutable_knobs()->set_hp_stale_ms(100);
  const absl::StatusOr<PolicyChange> all = PolicyChangeFromProto(r);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->all_gpus);
  EXPECT_EQ(all->mode, contract::GateMode::kPriority);
  EXPECT_EQ(all->hp_stale_ms, 100u);
  EXPECT_EQ(all->be_budget_us, 0u);  // every field: zeros included
  EXPECT_EQ(all->adapt_budget, false);
}

TEST(AdminMappingTest, UnknownKnobNamesAreRefused) {
  orion::v1::SetPolicyRequest r;
  r.add_fields("be_budget");
  const absl::StatusOr<PolicyChange> c = PolicyChangeFromProto(r);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("unknown field 'be_budget'"), std::string::npos);
  // The knobs it names are PolicyKnobs' fields, every one.
  EXPECT_NE(c.status().message().find("(expected mode, be_budget_us, sm_threshold, spin_us, "
                                      "hp_stale_ms, hp_grace_us, adapt_budget, gpu_hold, "
                                      "gpu_hold_max_ms, gpu_hold_release_ms)"),
            std::string::npos)
      << c.status().message();
}

// A high-priority pod ml/serve-0 in the request.
orion::v1::PodPolicy* AddHighPod(orion::v1::UpsertPodsRequest* r) {
  orion::v1::PodPolicy* p = r->add_pods();
  p->set_pod_uid("uid");
  p->set_name("serve-0");
  p->set_namespace_("ml");
  p->set_priority(orion::v1::PRIORITY_HIGH);
  return p;
}

TEST(AdminMappingTest, PodsNeedAPriorityAndKeepTheirLimits) {
  orion::v1::UpsertPodsRequest r;
  orion::v1::PodPolicy* p = AddHighPod(&r);
  p->set_memory_limit_bytes(1 << 20);
  p->set_latency_target_us(20000);
  const absl::StatusOr<std::vector<PodPolicy>> pods = PodsFromProto(r);
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 1u);
  EXPECT_EQ((*pods)[0].name, "serve-0");
  EXPECT_EQ((*pods)[0].ns, "ml");
  EXPECT_EQ((*pods)[0].priority, contract::Priority::kHigh);
  EXPECT_EQ((*pods)[0].memory_limit_bytes, 1u << 20);
  EXPECT_EQ((*pods)[0].latency_target_us, 20000u);

  r.add_pods()->set_name("train-1");
  const absl::StatusOr<std::vector<PodPolicy>> unset = PodsFromProto(r);
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.status().message().find("pods[1] (/train-1): priority is unset"),
            std::string::npos);
}

// The GPUs of a pod's high devices are among its GPUs, or the whole request is refused.
TEST(AdminMappingTest, HighDevicesGpusMustBeThePodsGpus) {
  orion::v1::UpsertPodsRequest r;
  orion::v1::PodPolicy* p = AddHighPod(&r);
  p->add_gpu_uuids("GPU-a");
  p->add_gpu_uuids("GPU-b");
  p->add_high_gpu_uuids("GPU-a");
  const absl::StatusOr<std::vector<PodPolicy>> pods = PodsFromProto(r);
  ASSERT_TRUE(pods.ok()) << pods.status();
  EXPECT_EQ((*pods)[0].high_gpu_uuids, std::vector<std::string>{"GPU-a"});
  p->add_high_gpu_uuids("GPU-c");
  const absl::StatusOr<std::vector<PodPolicy>> bad = PodsFromProto(r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pods[0].high_gpu_uuids[1] (ml/serve-0): 'GPU-c' is not "
                                        "one of its gpu_uuids"),
            std::string::npos)
      << bad.status().message();
}

TEST(AdminMappingTest, ViewsBecomeTheMessagesCallersRead) {
  ClientView v;
  v.client_id = 7;
  v.pod = "serve-0";
  v.ns = "ml";
  v.policy.priority = contract::Priority::kHigh;
  v.policy.source = "admin";
  v.policy.memory_limit_bytes = 99;
  v.kernels_launched = 12;
  orion::v1::Client c;
  ToProto(v, &c);
  EXPECT_EQ(c.client_id(), 7u);
  EXPECT_EQ(c.namespace_(), "ml");
  EXPECT_EQ(c.priority(), orion::v1::PRIORITY_HIGH);
  EXPECT_EQ(c.priority_source(), "admin");
  EXPECT_EQ(c.memory_limit_bytes(), 99u);
  EXPECT_EQ(c.kernels_launched(), 12u);

  GpuPolicy p;
  p.knobs.mode = contract::GateMode::kMps;
  p.knobs.be_budget_ns = 5000000;
  p.knobs.hp_grace_ns = 500000;
  p.knobs.gpu_hold_max_ns = 250000000;
  p.knobs.gpu_hold_release_ns = 45000000000;
  orion::v1::PolicyKnobs k;
  ToProto(p, &k);
  EXPECT_EQ(k.gpu_hold_max_ms(), 250u);
  EXPECT_EQ(k.gpu_hold_release_ms(), 45000u);
  EXPECT_EQ(k.mode(), orion::v1::GATE_MODE_MPS);
  EXPECT_EQ(k.be_budget_us(), 5000u);
  EXPECT_EQ(k.hp_grace_us(), 500u);
  EXPECT_TRUE(k.adapt_budget());
}

}  // namespace
}  // namespace orion::server
