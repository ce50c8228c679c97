// sync gradcode (fabric/sync/gradcode_sync.cc): 4 workers as threads, s = 1 (groups {0,1} and
// {2,3}), one in-process aggregator with gradient groups. Partition p's gradient is the constant
// p + 1, so with lr 1 and no momentum every step moves the model by exactly minus the average
// over the partitions, 2.5 (exact in f32). A straggler is held (not timed) until the others have
// finished: their rounds must complete without it, and it must then catch up on every round
// without computing it and end with the same model bits. A worker stalled for half the window
// holds the others (bounded lag) instead of falling out of the rounds the daemons keep.
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "aggregator/aggregator_server.h"
#include "fabric/rendezvous/hash_store.h"
#include "fabric/sync/sync_algorithm.h"
#include "tests/support/forwarding_store.h"
#include "tests/support/thread_ranks.h"

namespace cofab::sync {
namespace {

constexpr int kWorkers = 4;
constexpr size_t kModel = 300;  // two tensors, 200 + 100 floats

// Opens when the other workers are done (the straggler's hold; no timing involved).
class Gate {
 public:
  void arrive() {
    std::lock_guard<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
  }
  void waitFor(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return arrived_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
};

struct Outcome {
  Status status;
  std::vector<std::vector<float>> finals;
  std::vector<SyncStats> stats;
  std::vector<int> needed;         // steps for which needsGradient() said true, by rank
  std::vector<int> doneMarksLeft;  // rounds whose done mark is still in the store at the end
};

// Where gradcode keeps its marks in the store: under the client's default storePrefix.
std::string syncKey(const std::string& what) { return "cofab/agg/sync/gradcode/" + what; }

std::unique_ptr<aggregator::AggregatorServer> gradientServer(int daemonStragglers) {
  aggregator::ServerOptions so;
  so.numWorkers = kWorkers;
  so.listenAddress = "127.0.0.1:0";
  so.engine.gradientStragglers = daemonStragglers;
  auto server = aggregator::AggregatorServer::create(so);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

SyncEnv envOf(int rank, Store* store, const aggregator::AggregatorServer& server) {
  SyncEnv env;
  env.rank = rank;
  env.worldSize = kWorkers;
  env.store = store;
  env.client.serverAddresses = {server.address()};
  env.client.chunkBytes = 256;  // several chunks per tensor
  return env;
}

SyncOptions gradcodeOptions(int window) {
  SyncOptions o;
  o.algorithm = "gradcode";
  o.lr = 1.0f;
  o.momentum = 0.0f;
  o.gradientStragglers = 1;
  o.gradcodeWindow = window;
  o.timeoutMs = 20000;
  return o;
}

// The gradient of step s on this worker: partition p's is the constant p + 1.
std::vector<float> gradientOf(const SyncAlgorithm& algo) {
  std::vector<float> grad(kModel, 0.0f);
  for (int p : algo.partitions()) {
    for (float& g : grad) g += float(p + 1);
  }
  return grad;
}

// `steps` steps; `straggler` (or -1) is held after start() until the others finished, or, with
// `releaseAtProgress` > 0, until every other worker has published at least that progress (its
// bounded-lag mark in the store); `atRelease` then runs on the store before the straggler goes on.
Outcome run(int straggler, int steps, int window, int daemonStragglers = 1,
            uint64_t releaseAtProgress = 0, std::function<void(Store&)> atRelease = {}) {
  auto server = gradientServer(daemonStragglers);
  Outcome out;
  if (server == nullptr) return out;
  HashStore store;
  Gate othersDone;
  out.finals.assign(kWorkers, std::vector<float>(kModel, 0.0f));
  out.stats.resize(kWorkers);
  out.needed.assign(kWorkers, 0);
  auto results = testing::runThreadRanks(kWorkers, [&](int rank) -> Status {
    Status st = [&]() -> Status {
      COFAB_ASSIGN_OR_RETURN(auto algo,
                             makeSyncAlgorithm(gradcodeOptions(window), envOf(rank, &store, *server)));
      std::vector<float> model(kModel, 0.0f);
      COFAB_RETURN_IF_ERROR(algo->start(model, {200, 100}));
      if (rank == straggler && releaseAtProgress == 0) othersDone.waitFor(kWorkers - 1);
      if (rank == straggler && releaseAtProgress > 0) {
        for (int r = 0; r < kWorkers; ++r) {
          if (r == straggler) continue;
          const std::string key = syncKey("progress/" + std::to_string(r));
          // A condition, not a time: the others stop at the bounded-lag check (bounded, so a
          // key this loop does not know fails the test instead of hanging it).
          for (const Deadline d = Deadline::afterMs(20000);;) {
            if (d.expired()) {
              return DeadlineExceeded("worker " + std::to_string(r) + " never published " + key);
            }
            COFAB_ASSIGN_OR_RETURN(bool there, store.check({key}));
            if (there) {
              COFAB_ASSIGN_OR_RETURN(Bytes v, store.get(key, Deadline::afterMs(20000)));
              if (std::stoull(std::string(v.begin(), v.end())) >= releaseAtProgress) break;
            }
            std::this_thread::sleep_for(Millis(1));
          }
        }
        if (atRelease) atRelease(store);
      }
      for (int s = 0; s < steps; ++s) {
        COFAB_ASSIGN_OR_RETURN(bool need, algo->needsGradient(0, uint64_t(s)));
        std::vector<float> grad;
        if (need) {
          ++out.needed[size_t(rank)];
          grad = gradientOf(*algo);
        }
        COFAB_RETURN_IF_ERROR(algo->step(0, grad, uint64_t(s), 1));
      }
      out.stats[size_t(rank)] = algo->stats();
      return algo->finish(out.finals[size_t(rank)]);
    }();
    if (rank != straggler) othersDone.arrive();
    return st;
  });
  server->shutdown("test done");
  out.status = testing::allOk(results);
  for (int r = 0; r < steps; ++r) {
    auto there = store.check({syncKey("done/" + std::to_string(r))});
    if (!there.ok() || *there) out.doneMarksLeft.push_back(r);
  }
  return out;
}

TEST(GradcodeSyncTest, EveryStragglerSetOfSizeAtMostSGetsTheFullAverage) {
  constexpr int kSteps = 3;
  for (int straggler = -1; straggler < kWorkers; ++straggler) {
    SCOPED_TRACE("straggler " + std::to_string(straggler));
    Outcome o = run(straggler, kSteps, /*window=*/16);
    ASSERT_TRUE(o.status.ok()) << o.status;
    for (int r = 0; r < kWorkers; ++r) {
      for (float v : o.finals[size_t(r)]) ASSERT_EQ(v, -2.5f * kSteps) << "rank " << r;
      EXPECT_EQ(o.stats[size_t(r)].steps, uint64_t(kSteps));
    }
    if (straggler >= 0) {
      // Every round completed while it was held: it computed none and fetched them all.
      EXPECT_EQ(o.needed[size_t(straggler)], 0);
      EXPECT_EQ(o.stats[size_t(straggler)].skipped, uint64_t(kSteps));
      // Its partner computed every round (its group had no one else).
      const int partner = straggler ^ 1;
      EXPECT_EQ(o.needed[size_t(partner)], kSteps);
    }
  }
}

// Window 8: progress is published every 2 rounds, and before round r (even, >= 4) a worker
// waits for everyone to be at r - 4 or later. With rank 3 stalled at round 0 the others complete
// rounds 0-5 and stop before round 6 (none of them completes it), instead of running out of the
// rounds the daemons keep; released, rank 3 catches up and everyone finishes with the same model.
TEST(GradcodeSyncTest, AStalledWorkerHoldsTheOthersAtHalfTheWindow) {
  bool round6Done = true, round5Done = false;
  Outcome o = run(/*straggler=*/3, /*steps=*/20, /*window=*/8, 1, /*releaseAtProgress=*/6,
                  [&](Store& store) {
                    auto five = store.check({syncKey("done/5")});
                    auto six = store.check({syncKey("done/6")});
                    round5Done = five.ok() && *five;
                    round6Done = !six.ok() || *six;
                  });
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_TRUE(round5Done);
  EXPECT_FALSE(round6Done) << "a worker ran past the bounded-lag check";
  for (int r = 0; r < kWorkers; ++r) {
    for (float v : o.finals[size_t(r)]) ASSERT_EQ(v, -2.5f * 20) << "rank " << r;
  }
  EXPECT_GE(o.stats[3].skipped, 6u);  // rounds 0-5 completed while it was stalled
}

// Window 4: every round two windows (8 rounds) old has its done mark removed, so after 40 rounds
// only the last 8 are left in the store, and the models are still the full average every round.
TEST(GradcodeSyncTest, OldDoneMarksAreRemovedFromTheStore) {
  constexpr int kSteps = 40;
  Outcome o = run(/*straggler=*/-1, kSteps, /*window=*/4);
  ASSERT_TRUE(o.status.ok()) << o.status;
  std::vector<int> lastTwoWindows;
  for (int r = kSteps - 8; r < kSteps; ++r) lastTwoWindows.push_back(r);
  EXPECT_EQ(o.doneMarksLeft, lastTwoWindows);
  for (int r = 0; r < kWorkers; ++r) {
    for (float v : o.finals[size_t(r)]) ASSERT_EQ(v, -2.5f * kSteps) << "rank " << r;
  }
}

TEST(GradcodeSyncTest, PlainDaemonsAreRefusedAtStart) {
  Outcome o = run(/*straggler=*/-1, /*steps=*/1, /*window=*/16, /*daemonStragglers=*/-1);
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), StatusCode::kFailedPrecondition) << o.status;
  EXPECT_NE(o.status.message().find("--gradient-stragglers 1"), std::string::npos) << o.status;
}

// A store whose first set() of a key containing `part` fails (a store hiccup).
class SetFailsOnce final : public testing::ForwardingStore {
 public:
  SetFailsOnce(Store* s, std::string part) : ForwardingStore(s), part_(std::move(part)) {}
  Status set(std::string_view k, const Bytes& v) override {
    if (!failed_ && k.find(part_) != std::string_view::npos) {
      failed_ = true;
      return IoError("injected: the store is unreachable");
    }
    return to_->set(k, v);
  }

 private:
  std::string part_;
  bool failed_ = false;
};

// Worker 0's store fails when step 0's round has completed (setting the round's done mark).
// The round's update must not be lost in silence: the error is sticky, so the loop that logs it
// and carries on gets it again from every later step and from finish(), instead of training on
// one update behind the others (which it did: later steps were OK and the models differed).
TEST(GradcodeSyncTest, AStoreErrorAfterARoundCompletedIsSticky) {
  auto server = gradientServer(1);
  ASSERT_NE(server, nullptr);
  HashStore store;
  SetFailsOnce flaky(&store, "/done/0");
  constexpr int kSteps = 3;
  std::vector<Status> firstError(kWorkers), finished(kWorkers);
  std::vector<std::vector<float>> finals(kWorkers, std::vector<float>(kModel));
  auto results = testing::runThreadRanks(kWorkers, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(auto algo, makeSyncAlgorithm(gradcodeOptions(16),
                                                        envOf(rank, rank == 0 ? static_cast<Store*>(&flaky) : &store,
                                                              *server)));
    COFAB_RETURN_IF_ERROR(algo->start(std::vector<float>(kModel, 0.0f), {200, 100}));
    for (int s = 0; s < kSteps; ++s) {
      Status st = algo->step(0, gradientOf(*algo), uint64_t(s), 1);
      if (!st.ok() && firstError[size_t(rank)].ok()) firstError[size_t(rank)] = st;
      if (!st.ok() && rank == 0) {
        EXPECT_EQ(st, firstError[0]) << "step " << s;
      }
    }
    finished[size_t(rank)] = algo->finish(finals[size_t(rank)]);
    return OkStatus();
  });
  server->shutdown("test done");
  ASSERT_TRUE(testing::allOk(results).ok()) << testing::allOk(results);
  EXPECT_EQ(firstError[0].code(), StatusCode::kIoError) << firstError[0];
  EXPECT_EQ(finished[0], firstError[0]);
  for (int r = 1; r < kWorkers; ++r) {
    EXPECT_TRUE(firstError[size_t(r)].ok()) << "rank " << r << ": " << firstError[size_t(r)];
    ASSERT_TRUE(finished[size_t(r)].ok()) << finished[size_t(r)];
    for (float v : finals[size_t(r)]) ASSERT_EQ(v, -2.5f * kSteps) << "rank " << r;
  }
}

TEST(GradcodeSyncTest, RejectsAGroupSizeThatDoesNotDivideTheWorkers) {
  HashStore store;
  SyncEnv env;
  env.rank = 0;
  env.worldSize = 4;
  env.store = &store;
  SyncOptions o;
  o.algorithm = "gradcode";
  o.gradientStragglers = 2;  // groups of 3 do not divide 4 workers
  EXPECT_EQ(makeSyncAlgorithm(o, env).status().code(), StatusCode::kInvalidArgument);
  o.gradientStragglers = 1;
  env.store = nullptr;
  env.client.serverAddresses = {"127.0.0.1:1"};
  EXPECT_EQ(makeSyncAlgorithm(o, env).status().code(), StatusCode::kInvalidArgument);  // no store
}

}  // namespace
}  // namespace cofab::sync
