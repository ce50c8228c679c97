// Helpers shared by the model store's tests (model_store_test.cc, model_store_versions_test.cc):
// a ModelClient connected to a DaemonCluster's store, f32 views of vectors, and the generous
// deadline those tests use for every call (real daemon processes on a loaded 2-core machine).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fabric/ps/model_client.h"
#include "fabric/ps/push_pull.h"
#include "tests/aggregator/daemon_cluster.h"

namespace cofab::testing {

inline Deadline kLong() { return Deadline::afterMs(20000); }

inline StatusOr<std::unique_ptr<ps::ModelClient>> connectModel(DaemonCluster& c, int rank,
                                                               size_t chunkBytes = 0) {
  ps::ClientOptions o;
  o.chunkBytes = chunkBytes;
  return ps::ModelClient::connect(c.store(), rank, c.workers(), o);
}

// One daemon started with `args` and two workers' ModelClients, a and b: the two-worker tests'
// common start.
struct TwoWorkers {
  explicit TwoWorkers(std::vector<std::string> args) : cluster(1, 2, std::move(args)) {}
  Status start() {
    COFAB_RETURN_IF_ERROR(cluster.start());
    COFAB_ASSIGN_OR_RETURN(a, connectModel(cluster, 0));
    COFAB_ASSIGN_OR_RETURN(b, connectModel(cluster, 1));
    return OkStatus();
  }
  DaemonCluster cluster;
  std::unique_ptr<ps::ModelClient> a, b;
};

inline TensorView view(std::vector<float>& v) {
  return TensorView::of(v.data(), v.size(), DType::kF32);
}

// Every daemon's staleness gauge and histogram stay within tau: the largest applied staleness is
// <= tau and every observation is counted in the buckets up to tau.
inline void expectDaemonStalenessWithin(DaemonCluster& cluster, int64_t tau) {
  for (int s = 0; s < cluster.servers(); ++s) {
    auto max = cluster.metric(s, "cofab_agg_model_staleness_max");
    ASSERT_TRUE(max.ok()) << max.status();
    EXPECT_LE(*max, tau) << "daemon " << s;
    auto count = cluster.metric(s, "cofab_agg_model_staleness_count");
    auto withinTau =
        cluster.metric(s, "cofab_agg_model_staleness_bucket", "le=\"" + std::to_string(tau) + "\"");
    ASSERT_TRUE(count.ok() && withinTau.ok());
    EXPECT_EQ(*withinTau, *count) << "daemon " << s << ": an observation above tau";
  }
}

}  // namespace cofab::testing
