// Prometheus exposition of the node's state. Values are computed at scrape time from one
// NodeState snapshot (a prometheus::Collectable), so clients that go away leave no stale series
// and a scrape costs one lock, whatever the number of clients.
//
// Usage:
//   auto collector = std::make_shared<MetricsCollector>(&state, config.node_name);
//   exposer.RegisterCollectable(collector);   // serves /metrics
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/node_state.h"

namespace orion::server {

class MetricsCollector : public prometheus::Collectable {
 public:
  MetricsCollector(NodeState* state, std::string node) : state_(state), node_(std::move(node)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  NodeState* state_;
  std::string node_;
};

}  // namespace orion::server
