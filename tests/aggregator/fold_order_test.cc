// Arrival order against the documented rank order (docs/AGGREGATOR.md §4): contributions pushed
// in a chosen order — each one acked before the next is sent, so the engine sees exactly that
// order — must give the serial reference's bits for every dtype, sum and average, with and
// without a backup, over several rounds of one slot (pooled buffers reused), and a duplicate of
// an accepted contribution (with other bytes) must not be applied again. Guards any change to
// when the engine folds (e.g. folding the rank-order prefix as it arrives).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/aggregator/test_data.h"

namespace cofab::testing {
namespace {

constexpr int kWorkers = 4;

class Servers {
 public:
  // replication: two servers, 0 forwarding to 1 (only 0 gets pushes here).
  Status start(bool replication) {
    const int n = replication ? 2 : 1;
    for (int i = 0; i < n; ++i) {
      aggregator::ServerOptions so;
      so.id = i;
      so.numServers = n;
      so.numWorkers = kWorkers;
      so.engineThreads = 1;
      so.replication = replication;
      so.listenAddress = "127.0.0.1:0";
      so.drainTimeoutMs = 300;
      COFAB_ASSIGN_OR_RETURN(auto s, aggregator::AggregatorServer::create(so));
      servers.push_back(std::move(s));
    }
    if (replication) {
      COFAB_RETURN_IF_ERROR(
          servers[0]->connectBackup(servers[1]->address(), Deadline::afterMs(10000)));
    }
    for (int r = 0; r < kWorkers; ++r) {
      COFAB_ASSIGN_OR_RETURN(
          auto p, RawPeer::connect(servers[0]->address(), "worker " + std::to_string(r)));
      peers.push_back(std::move(p));
    }
    return OkStatus();
  }
  // Stops everything: afterwards the engines are idle and the metrics final (a round's counter
  // moves after its results are sent).
  void stop() {
    peers.clear();
    for (auto& s : servers) s->shutdown("test done");
  }
  ~Servers() { stop(); }
  std::vector<std::unique_ptr<aggregator::AggregatorServer>> servers;
  std::vector<std::unique_ptr<RawPeer>> peers;
};

struct Case {
  DType dtype;
  size_t count;
  bool average;
};

// Pushes rank `r`'s tensor (or `bytes` instead) and waits for its ack, which the engine sends
// once the contribution is durable: the next push reaches the engine after this one.
Status pushAndWaitAck(Servers& s, int r, const wire::Header& h, const std::vector<uint8_t>& bytes) {
  COFAB_RETURN_IF_ERROR(s.peers[static_cast<size_t>(r)]->send(h, bytes));
  COFAB_ASSIGN_OR_RETURN(RawMessage m, s.peers[static_cast<size_t>(r)]->recv());
  if (!m.isControl(ps::ControlOp::kAck)) {
    return FailedPrecondition("rank " + std::to_string(r) + ": expected an ack, got " + m.text());
  }
  return OkStatus();
}

void runOrders(bool replication) {
  Servers s;
  Status st = s.start(replication);
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<std::vector<int>> orders = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 0, 3, 2},
                                                {3, 1, 0, 2}, {0, 2, 3, 1}, {2, 0, 1, 3}};
  const std::vector<Case> cases = {{DType::kF32, 5000, false}, {DType::kF32, 3, true},
                                   {DType::kF64, 2049, true},  {DType::kF64, 1, false},
                                   {DType::kF16, 4097, true},  {DType::kBF16, 2048, false}};
  uint64_t key = 100;
  for (const Case& c : cases) {
    ++key;
    // One slot through every order: each round is the next iteration of the same key.
    for (uint64_t it = 0; it < orders.size(); ++it) {
      const auto& order = orders[it];
      SCOPED_TRACE(std::string(dtypeName(c.dtype)) + " count " + std::to_string(c.count) +
                   (c.average ? " average" : " sum") + " iteration " + std::to_string(it) +
                   (replication ? " replicated" : ""));
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < kWorkers; ++r) inputs.push_back(makeTensor(c.dtype, c.count, r, key, it));
      const uint8_t bits = ps::kPushDeliver | (c.average ? ps::kPushAverage : 0);
      for (size_t i = 0; i < order.size(); ++i) {
        const int r = order[i];
        const auto h = RawPeer::push(static_cast<uint32_t>(r), key, it, c.dtype, 1, bits);
        st = pushAndWaitAck(s, r, h, inputs[static_cast<size_t>(r)]);
        ASSERT_TRUE(st.ok()) << st;
        if (i == 1 && order[0] == 0 && r == 1) {
          // A resend (with other bytes) of an accepted contribution is a duplicate, acked and
          // never applied.
          std::vector<uint8_t> other(inputs[1].size(), 0x3c);
          st = pushAndWaitAck(s, r, h, other);
          ASSERT_TRUE(st.ok()) << st;
        }
      }
      const auto want = referenceReduce(c.dtype, c.average, inputs);
      for (int r = 0; r < kWorkers; ++r) {
        auto m = s.peers[static_cast<size_t>(r)]->recvSkippingAcks();
        ASSERT_TRUE(m.ok()) << m.status();
        ASSERT_EQ(m->header.type, wire::MessageType::kPullReply)
            << "rank " << r << ": " << m->text();
        EXPECT_EQ(m->header.iteration, it);
        EXPECT_TRUE(m->payload == want) << "rank " << r << ": result differs from the reference";
      }
    }
  }
  s.stop();
  const auto& metrics = s.servers[0]->metrics();
  const uint64_t rounds = cases.size() * orders.size();
  EXPECT_EQ(metrics.chunksApplied.load(), rounds * kWorkers);
  EXPECT_EQ(metrics.roundsCompleted.load(), rounds);
  // One duplicate per case: the orders starting 0, 1.
  EXPECT_EQ(metrics.chunksDuplicate.load(), cases.size());
  if (replication) {
    EXPECT_EQ(metrics.chunksForwarded.load(), rounds * kWorkers);
    EXPECT_EQ(s.servers[1]->metrics().roundsCompleted.load(), rounds);
  }
}

TEST(FoldOrder, AnyArrivalOrderGivesTheReferenceBits) { runOrders(/*replication=*/false); }

TEST(FoldOrder, AnyArrivalOrderGivesTheReferenceBitsWithABackup) {
  runOrders(/*replication=*/true);
}

}  // namespace
}  // namespace cofab::testing
