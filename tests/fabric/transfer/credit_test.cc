// Incast control with receiver-driven credits (cofab-aggd --credit-bytes): checked on the
// aggregator's side through its /metrics. Well-behaved clients never exceed their grant (no
// violation, no connection ever above the window) while their chunks queue for credit; a raw
// sender that ignores the grant is detected and counted; a client that expects grants from a
// daemon that gives none says so instead of hanging.
#include <gtest/gtest.h>

#include "fabric/ps/push_pull.h"
#include "fabric/transfer/transfer_manager.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

constexpr size_t kWindow = 64 << 10;
constexpr size_t kChunk = 16 << 10;

TEST(Credits, GrantsAreNeverExceededAndResultsStayExact) {
  const int kWorkers = 4;
  DaemonCluster cluster(1, kWorkers, {"--credit-bytes", std::to_string(kWindow)});
  ASSERT_TRUE(cluster.start().ok());
  const size_t n = (1 << 20) / sizeof(float);  // 64 chunks per worker, sent in one call
  std::vector<uint64_t> stalls(kWorkers);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    co.credits = 1;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    for (int it = 0; it < 2; ++it) {
      std::vector<float> in(n), out(n);
      for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i + rank + it) % 17);
      // Half directly, half through the transfer manager (which sits on the same client).
      COFAB_ASSIGN_OR_RETURN(auto mgr, transfer::TransferManager::create(*client, {}));
      ps::PushPullHandle h = client->pushPull(1, TensorView::of(in.data(), n, DType::kF32),
                                              TensorView::of(out.data(), n, DType::kF32));
      std::vector<float> in2 = in, out2(n);
      transfer::GradientUpdate g;
      g.key = 2;
      g.tensor = TensorView::of(in2.data(), n, DType::kF32);
      g.out = TensorView::of(out2.data(), n, DType::kF32);
      auto h2 = mgr->enqueue(g);
      COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(30000)));
      COFAB_RETURN_IF_ERROR(h2.wait(Deadline::afterMs(30000)));
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < kWorkers; ++r) want += static_cast<float>((i + r + it) % 17);
        if (out[i] != want || out2[i] != want) {
          return Internal("element " + std::to_string(i) + " differs from the serial sum");
        }
      }
    }
    stalls[static_cast<size_t>(rank)] = client->stats().creditStalls;
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  // 64 chunks handed over at once against a window of 4: the rest had to wait for credit.
  for (int r = 0; r < kWorkers; ++r) EXPECT_GT(stalls[static_cast<size_t>(r)], 0u) << r;
  auto violations = cluster.metric(0, "cofab_agg_credit_violations_total");
  auto outstanding = cluster.metric(0, "cofab_agg_credit_outstanding_max_bytes");
  auto window = cluster.metric(0, "cofab_agg_credit_window_bytes");
  auto backlog = cluster.metric(0, "cofab_agg_backlog_max_bytes");
  ASSERT_TRUE(violations.ok() && outstanding.ok() && window.ok() && backlog.ok());
  EXPECT_EQ(*violations, 0);
  EXPECT_EQ(*window, static_cast<double>(kWindow));
  EXPECT_GT(*outstanding, 0);
  EXPECT_LE(*outstanding, static_cast<double>(kWindow));
  EXPECT_LE(*backlog, static_cast<double>(kWorkers * kWindow));
}

// With replication a primary forwards every contribution to its backup; that link has no grant
// and must not be counted against one.
TEST(Credits, ForwardingToTheBackupIsNotAViolation) {
  const int kWorkers = 2;
  DaemonCluster cluster(2, kWorkers,
                        {"--replication", "on", "--credit-bytes", std::to_string(kWindow)});
  ASSERT_TRUE(cluster.start().ok());
  const size_t n = (512 << 10) / sizeof(float);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    co.credits = 1;
    co.replication = 1;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    std::vector<float> x(n, static_cast<float>(rank + 1));
    const TensorView v = TensorView::of(x.data(), n, DType::kF32);
    COFAB_RETURN_IF_ERROR(client->pushPull(1, v, v).wait(Deadline::afterMs(30000)));
    for (float f : x) {
      if (f != 3.0f) return Internal("wrong sum");
    }
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  for (int d = 0; d < 2; ++d) {
    auto violations = cluster.metric(d, "cofab_agg_credit_violations_total");
    auto forwarded = cluster.metric(d, "cofab_agg_forwarded_applied_total");
    ASSERT_TRUE(violations.ok() && forwarded.ok());
    EXPECT_EQ(*violations, 0) << "daemon " << d;
    EXPECT_GT(*forwarded, 0) << "daemon " << d;
  }
}

TEST(Credits, SenderIgnoringItsGrantIsCounted) {
  const size_t window = 4096;
  DaemonCluster cluster(1, 2, {"--credit-bytes", std::to_string(window)});
  ASSERT_TRUE(cluster.start().ok());
  auto peer = RawPeer::connect(cluster.address(0), ps::workerPeerId(0));
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto grant = (*peer)->recv();
  ASSERT_TRUE(grant.ok()) << grant.status();
  ASSERT_TRUE(grant->isControl(ps::ControlOp::kCredit));
  ASSERT_EQ(grant->payload.size(), 8u);
  uint64_t granted = 0;
  for (size_t i = 0; i < 8; ++i) granted |= static_cast<uint64_t>(grant->payload[i]) << (8 * i);
  EXPECT_EQ(granted, window);
  // A burst of window-sized pushes, never waiting for an ack: far beyond the grant.
  const int kBurst = 200;
  const std::vector<float> values(window / sizeof(float), 1.0f);
  for (int k = 0; k < kBurst; ++k) {
    ASSERT_TRUE((*peer)->sendValues(RawPeer::push(0, 1000 + k, 0, DType::kF32), values).ok());
  }
  // Wait until the daemon has received the whole burst, then read its verdict.
  double in = 0;
  for (int i = 0; i < 1000 && in < kBurst * static_cast<double>(window); ++i) {
    auto b = cluster.metric(0, "cofab_agg_bytes_in_total");
    ASSERT_TRUE(b.ok()) << b.status();
    in = *b;
    if (in < kBurst * static_cast<double>(window)) {
      std::this_thread::sleep_for(Millis(10));
    }
  }
  ASSERT_EQ(in, kBurst * static_cast<double>(window));
  auto violations = cluster.metric(0, "cofab_agg_credit_violations_total");
  auto outstanding = cluster.metric(0, "cofab_agg_credit_outstanding_max_bytes");
  ASSERT_TRUE(violations.ok() && outstanding.ok());
  EXPECT_GT(*violations, 0);
  EXPECT_GT(*outstanding, static_cast<double>(window));
}

TEST(Credits, ClientExpectingGrantsFromADaemonWithoutCreditsSaysSo) {
  DaemonCluster cluster(1, 1);  // no --credit-bytes
  ASSERT_TRUE(cluster.start().ok());
  ps::ClientOptions co;
  co.credits = 1;
  co.connectTimeoutMs = 300;
  auto client = cluster.connect(0, co);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(client.status().message().find("credit"), std::string::npos) << client.status();
}

}  // namespace
}  // namespace cofab::testing
