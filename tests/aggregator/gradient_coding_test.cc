// Gradient coding in cofab-aggd (--gradient-stragglers s, aggregator/gradient_groups.h) with the
// worker-side GradientCodingClient: under every straggler set of size <= s the round completes
// from the workers that pushed, and the result is the full gradient sum over all n partitions
// (bit-exact against coding's GradientDecoder, close to the plain sum); a straggler's late push
// gets the same result; a group map that does not fit the workers is refused at startup.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "coding/gradient/fractional_repetition.h"
#include "fabric/coded/gradient_coding_client.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/raw_peer.h"

namespace cofab::testing {
namespace {

// create() probes the daemons collectively: every worker's in its own thread, as in a job.
std::vector<StatusOr<coded::GradientCodingClient>> createCoders(
    std::vector<std::unique_ptr<ps::PushPullClient>>& clients, int s) {
  std::vector<StatusOr<coded::GradientCodingClient>> coders(clients.size(),
                                                            Internal("not created"));
  std::vector<std::thread> threads;
  for (size_t w = 0; w < clients.size(); ++w) {
    threads.emplace_back([&, w] {
      coders[w] = coded::GradientCodingClient::create(clients[w].get(), s,
                                                       Deadline::afterMs(20000));
    });
  }
  for (auto& t : threads) t.join();
  return coders;
}

std::vector<std::unique_ptr<ps::PushPullClient>> connectAll(DaemonCluster& cluster) {
  std::vector<std::unique_ptr<ps::PushPullClient>> clients;
  for (int w = 0; w < cluster.workers(); ++w) {
    ps::ClientOptions co;
    co.chunkBytes = 4096;
    auto c = cluster.connect(w, co);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) clients.push_back(std::move(*c));
  }
  return clients;
}

// Every straggler set of size <= s over n workers.
std::vector<std::vector<int>> stragglerSets(int n, int s) {
  std::vector<std::vector<int>> out;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    if (__builtin_popcount(mask) > s) continue;
    std::vector<int> set;
    for (int w = 0; w < n; ++w) {
      if (mask & (1u << w)) set.push_back(w);
    }
    out.push_back(set);
  }
  return out;
}

void runAllStragglerSets(int n, int s, int servers) {
  const size_t elems = 3000;  // several chunks with chunkBytes 4096
  DaemonCluster cluster(servers, n, {"--gradient-stragglers", std::to_string(s)});
  ASSERT_TRUE(cluster.start().ok());
  std::vector<std::unique_ptr<ps::PushPullClient>> clients = connectAll(cluster);
  ASSERT_EQ(clients.size(), size_t(n));
  std::vector<coded::GradientCodingClient> coders;
  for (auto& g : createCoders(clients, s)) {
    ASSERT_TRUE(g.ok()) << g.status();
    coders.push_back(std::move(*g));
  }
  auto code = coding::FractionalRepetitionCode::create({.workers = n, .stragglers = s});
  ASSERT_TRUE(code.ok());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  uint64_t iteration = 0;
  for (const std::vector<int>& stragglers : stragglerSets(n, s)) {
    std::string name = "stragglers {";
    for (int w : stragglers) name += std::to_string(w) + " ";
    SCOPED_TRACE(name + "}");
    // A fresh gradient per data partition this round.
    std::vector<std::vector<float>> partition(n, std::vector<float>(elems));
    for (auto& p : partition) {
      for (float& x : p) x = u(rng);
    }
    auto gradientsOf = [&](int w) {
      std::vector<std::span<const float>> g;
      for (int p : coders[w].partitions()) g.emplace_back(partition[p]);
      return g;
    };
    // Reference: coding's decoder over one message per group, and the plain sum.
    coding::GradientDecoder decoder(*code, elems);
    std::vector<float> msg(elems);
    for (int w = 0; w < n; ++w) {
      auto g = gradientsOf(w);
      ASSERT_TRUE(code->encode(w, g, msg).ok());
      ASSERT_TRUE(decoder.add(w, msg).ok());
    }
    std::vector<float> want(elems), plain(elems, 0.0f);
    ASSERT_TRUE(decoder.finish(want).ok());
    for (const auto& p : partition) {
      for (size_t i = 0; i < elems; ++i) plain[i] += p[i];
    }
    std::vector<std::vector<float>> out(n, std::vector<float>(elems, NAN));
    ps::PushPullOptions po;
    po.iteration = iteration;
    std::vector<ps::PushPullHandle> handles(n);
    auto isStraggler = [&](int w) {
      return std::find(stragglers.begin(), stragglers.end(), w) != stragglers.end();
    };
    for (int w = 0; w < n; ++w) {
      if (isStraggler(w)) continue;
      auto g = gradientsOf(w);
      auto h = coders[w].pushPull(7, g, out[w], po);
      ASSERT_TRUE(h.ok()) << h.status();
      handles[w] = *h;
    }
    // The round completes without the stragglers.
    for (int w = 0; w < n; ++w) {
      if (isStraggler(w)) continue;
      ASSERT_TRUE(handles[w].wait(Deadline::afterMs(20000)).ok()) << handles[w].status();
      for (size_t i = 0; i < elems; ++i) {
        ASSERT_EQ(out[w][i], want[i]) << "worker " << w << " element " << i;
        ASSERT_NEAR(out[w][i], plain[i], 1e-4) << "element " << i;
      }
    }
    // Late stragglers get the finished round's result.
    for (int w : stragglers) {
      auto g = gradientsOf(w);
      auto h = coders[w].pushPull(7, g, out[w], po);
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(h->wait(Deadline::afterMs(20000)).ok()) << h->status();
      for (size_t i = 0; i < elems; ++i) ASSERT_EQ(out[w][i], want[i]) << "late worker " << w;
    }
    ++iteration;
  }
  for (auto& c : clients) c->close();
}

TEST(GradientCoding, FullSumUnderEveryStragglerSetUpToS) { runAllStragglerSets(4, 1, 1); }

TEST(GradientCoding, TwoStragglersOfSixOverTwoDaemons) { runAllStragglerSets(6, 2, 2); }

// Daemons that run no gradient coding, or another s, would return a multiple of the gradient
// with OK (plain: 2x for s = 1 of 4; s = 3: half). create() probes every daemon and refuses,
// naming the daemon and the flag.
void expectCreateRefused(int servers, std::vector<std::string> daemonArgs, int s) {
  DaemonCluster cluster(servers, 4, std::move(daemonArgs));
  ASSERT_TRUE(cluster.start().ok());
  std::vector<std::unique_ptr<ps::PushPullClient>> clients = connectAll(cluster);
  ASSERT_EQ(clients.size(), 4u);
  for (auto& g : createCoders(clients, s)) {
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kFailedPrecondition) << g.status();
    EXPECT_NE(g.status().message().find("start every cofab-aggd with --gradient-stragglers " +
                                        std::to_string(s)),
              std::string::npos)
        << g.status();
  }
  for (auto& c : clients) c->close();
}

TEST(GradientCoding, CreateRefusesPlainDaemons) { expectCreateRefused(2, {}, 1); }

TEST(GradientCoding, CreateRefusesDaemonsWithAnotherS) {
  expectCreateRefused(1, {"--gradient-stragglers", "3"}, 1);
}

TEST(GradientCoding, DaemonRefusesGroupsThatDoNotFitTheWorkers) {
  DaemonCluster cluster(1, 4, {"--gradient-stragglers", "2"});  // 3 does not divide 4
  Status s = cluster.start(Deadline::afterMs(2000));
  EXPECT_FALSE(s.ok());
}

// A worker lost for good (here at once: --dead-worker-ms 0) is waited for no more when its group
// is covered; nor when a live worker of its group may still cover it. The round used to fail at
// the first tick after another group's push, before the lost worker's group-mate had pushed:
// one crashed worker ended a job that gradient coding was there to carry on.
TEST(GradientCoding, ALostWorkerDoesNotFailARoundItsGroupMateWillCover) {
  DaemonCluster cluster(
      1, 4,
      {"--gradient-stragglers", "1", "--dead-worker-ms", "0", "--round-timeout-ms", "3600000"});
  ASSERT_TRUE(cluster.start().ok());
  {
    auto gone = RawPeer::connect(cluster.address(0), "worker 1");
    ASSERT_TRUE(gone.ok()) << gone.status();
  }  // broken without a goodbye: lost
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_workers_lost_total", 1).ok());
  auto w2 = RawPeer::connect(cluster.address(0), "worker 2");
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w2.ok() && w0.ok());
  ASSERT_TRUE(
      (*w2)->sendValues(RawPeer::push(2, 5, 0, DType::kF32), std::vector<float>(4, 2.0f)).ok());
  auto ack = (*w2)->recv();
  ASSERT_TRUE(ack.ok()) << ack.status();
  ASSERT_TRUE(ack->isControl(ps::ControlOp::kAck)) << ack->header.describe() << " " << ack->text();
  // Worker 2's round is open and worker 1 is gone; worker 0 (its group-mate) has not pushed yet.
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 5, 0, DType::kF32), std::vector<float>(4, 1.0f)).ok());
  for (auto* w : {&*w0, &*w2}) {
    auto result = (*w)->recvResult();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(*result, std::vector<float>(4, 3.0f)) << "one contribution per group: 1 + 2";
  }
}

}  // namespace
}  // namespace cofab::testing
