// Colocated push-pull with the worker's own shard in its process (AggregatorServer::
// connectInProcess + ClientOptions::inProcess): the results must be bit-identical to the same
// job with every worker reaching every shard over tcp, and to the serial reference.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "fabric/ps/push_pull.h"
#include "tests/aggregator/test_data.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

constexpr int kWorkers = 3;

struct Case {
  DType dtype;
  size_t count;
  bool average;
  uint64_t key;
};

// Small chunks so every tensor spreads over all three shards (and the last chunk is short).
constexpr size_t kChunkBytes = 64 << 10;

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {DType::kF32, 300001, false, 1},  {DType::kF32, 5, true, 2},
      {DType::kBF16, 100003, false, 3}, {DType::kF16, 70001, true, 4},
      {DType::kF64, 50001, false, 5},
  };
  return c;
}

class Shards {
 public:
  Status start() {
    for (int i = 0; i < kWorkers; ++i) {
      aggregator::ServerOptions so;
      so.id = i;
      so.numServers = kWorkers;
      so.numWorkers = kWorkers;
      so.engineThreads = 1;
      so.listenAddress = "127.0.0.1:0";
      so.drainTimeoutMs = 300;
      COFAB_ASSIGN_OR_RETURN(auto s, aggregator::AggregatorServer::create(so));
      addresses.push_back(s->address());
      servers.push_back(std::move(s));
    }
    return OkStatus();
  }
  ~Shards() {
    for (auto& s : servers) s->shutdown("test done");
  }
  std::vector<std::unique_ptr<aggregator::AggregatorServer>> servers;
  std::vector<std::string> addresses;
};

// Runs every case for two iterations on kWorkers thread-ranks; results[rank][case * 2 + it].
Status runJob(Shards& shards, bool inProcess, bool inPlace,
              std::vector<std::vector<std::vector<uint8_t>>>* results) {
  results->assign(kWorkers, {});
  return allOk(runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.serverAddresses = shards.addresses;
    co.chunkBytes = kChunkBytes;
    if (inProcess) {
      COFAB_ASSIGN_OR_RETURN(auto end,
                             shards.servers[static_cast<size_t>(rank)]->connectInProcess(rank));
      co.inProcess.emplace_back(rank, std::move(end));
    }
    COFAB_ASSIGN_OR_RETURN(auto client, ps::PushPullClient::connect(rank, kWorkers, co));
    auto& mine = (*results)[static_cast<size_t>(rank)];
    for (uint64_t it = 0; it < 2; ++it) {
      // Every tensor in flight at once, as a training step would batch them.
      std::vector<std::vector<uint8_t>> in, out;
      std::vector<ps::PushPullHandle> hs;
      for (const Case& c : cases()) {
        in.push_back(makeTensor(c.dtype, c.count, rank, c.key, it));
        out.emplace_back(in.back().size(), 0xEE);
      }
      for (size_t i = 0; i < cases().size(); ++i) {
        const Case& c = cases()[i];
        const TensorView vin = TensorView::of(in[i].data(), c.count, c.dtype);
        const TensorView vout = inPlace ? vin : TensorView::of(out[i].data(), c.count, c.dtype);
        ps::PushPullOptions po;
        po.op = c.average ? ps::ReduceOp::kAverage : ps::ReduceOp::kSum;
        hs.push_back(client->pushPull(c.key, vin, vout, po));
      }
      for (auto& h : hs) COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(20000)));
      for (size_t i = 0; i < cases().size(); ++i) mine.push_back(inPlace ? in[i] : out[i]);
    }
    client->close();
    return OkStatus();
  }));
}

TEST(ColocatedTest, InProcessShardIsBitIdenticalToTcpAndToTheReference) {
  Shards shards;
  ASSERT_TRUE(shards.start().ok());
  std::vector<std::vector<std::vector<uint8_t>>> viaTcp, viaPipe, viaPipeInPlace;
  ASSERT_TRUE(runJob(shards, /*inProcess=*/false, /*inPlace=*/false, &viaTcp).ok());
  // The same shards: their next rounds are iterations 2 and 3 of every key, so new shards.
  Shards shards2;
  ASSERT_TRUE(shards2.start().ok());
  Status s = runJob(shards2, /*inProcess=*/true, /*inPlace=*/false, &viaPipe);
  ASSERT_TRUE(s.ok()) << s;
  Shards shards3;
  ASSERT_TRUE(shards3.start().ok());
  s = runJob(shards3, /*inProcess=*/true, /*inPlace=*/true, &viaPipeInPlace);
  ASSERT_TRUE(s.ok()) << s;
  for (uint64_t it = 0; it < 2; ++it) {
    for (size_t i = 0; i < cases().size(); ++i) {
      const Case& c = cases()[i];
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < kWorkers; ++r)
        inputs.push_back(makeTensor(c.dtype, c.count, r, c.key, it));
      const auto want = referenceReduce(c.dtype, c.average, inputs);
      const size_t idx = it * cases().size() + i;
      for (int r = 0; r < kWorkers; ++r) {
        SCOPED_TRACE("key " + std::to_string(c.key) + " iteration " + std::to_string(it) +
                     " rank " + std::to_string(r));
        EXPECT_EQ(viaTcp[r][idx], want);
        EXPECT_EQ(viaPipe[r][idx], viaTcp[r][idx]);
        EXPECT_EQ(viaPipeInPlace[r][idx], viaTcp[r][idx]);
      }
    }
  }
}

TEST(ColocatedTest, BadInProcessArgumentsAreRejected) {
  Shards shards;
  ASSERT_TRUE(shards.start().ok());
  auto bad = shards.servers[0]->connectInProcess(kWorkers);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();

  auto end = shards.servers[0]->connectInProcess(0);
  ASSERT_TRUE(end.ok()) << end.status();
  ps::ClientOptions co;
  co.serverAddresses = shards.addresses;
  co.inProcess.emplace_back(kWorkers, *end);  // no daemon with that index
  auto c = ps::PushPullClient::connect(0, kWorkers, co);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("inProcess"), std::string::npos) << c.status();
}

TEST(ColocatedTest, ServerShutdownFailsTheWorkerInsteadOfHanging) {
  Shards shards;
  ASSERT_TRUE(shards.start().ok());
  auto end = shards.servers[0]->connectInProcess(0);
  ASSERT_TRUE(end.ok()) << end.status();
  ps::ClientOptions co;
  co.serverAddresses = shards.addresses;
  co.chunkBytes = kChunkBytes;
  co.inProcess.emplace_back(0, *end);
  auto c = ps::PushPullClient::connect(0, kWorkers, co);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> data(1000, 1.0f);
  const TensorView v = TensorView::of(data.data(), data.size(), DType::kF32);
  // Workers 1 and 2 never push: the round stays open until the shard goes away.
  ps::PushPullHandle h = (*c)->pushPull(9, v, v);
  shards.servers[0]->shutdown("test");
  Status s = h.wait(Deadline::afterMs(20000));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), StatusCode::kDeadlineExceeded) << s;
  (*c)->close();
}

}  // namespace
}  // namespace cofab::testing
