// gossip: decentralized SGD. Each worker takes local SGD-with-momentum steps; every syncEvery
// steps it averages its model with one peer over the communicator (point-to-point, no
// aggregator): x <- (x + x_peer) / 2. The peers form a perfect matching each round, the same on
// every worker: "ring" alternates between the right and the left neighbour (even rounds pair
// 2i with 2i+1, odd rounds 2i+1 with 2i+2, wrapping), "random" draws a random pairing from the
// shared seed and the round number. With an odd number of workers one sits a round out.
// Pairwise averaging keeps the sum of the models, so the mean model follows plain SGD on the
// average gradient while the spread between workers shrinks every round. finish() allreduces
// the final average.
#include <algorithm>
#include <numeric>
#include <random>

#include "fabric/comm/collectives.h"
#include "fabric/sync/algorithm_base.h"
#include "fabric/sync/gossip_peers.h"

namespace cofab::sync::detail {
namespace {

class GossipSync final : public AlgorithmBase {
 public:
  GossipSync(const SyncOptions& options, const SyncEnv& env)
      : AlgorithmBase("gossip", options, env, 1) {}

  Status doStart(std::span<const float> initial,
                 const std::vector<size_t>& tensorCounts) override {
    if (env_.comm == nullptr) return InvalidArgument("sync gossip needs env.comm (a Communicator)");
    if (env_.comm->rank() != env_.rank || env_.comm->size() != env_.worldSize) {
      // The pairs come from env's rank and size, the messages go over the communicator.
      return InvalidArgument("sync gossip: env says rank " + std::to_string(env_.rank) + " of " +
                             std::to_string(env_.worldSize) + ", env.comm is rank " +
                             std::to_string(env_.comm->rank()) + " of " +
                             std::to_string(env_.comm->size()) + ": pass the job's communicator");
    }
    if (options_.gossipPeers != "ring" && options_.gossipPeers != "random") {
      return InvalidArgument("sync gossip: gossipPeers '" + options_.gossipPeers +
                             "' is not 'ring' or 'random'");
    }
    COFAB_RETURN_IF_ERROR(setUp(initial, tensorCounts));
    round_ = 0;  // the pairs follow the round: every worker's restart begins again at 0
    mine_.assign(initial.begin(), initial.end());
    peer_.resize(total_);
    COFAB_RETURN_IF_ERROR(comm::allreduce(*env_.comm, TensorView(mine_.data(), total_, DType::kF32),
                                          collective(comm::ReduceOp::kAvg))
                              .withContext("sync gossip: start(): averaging the initial models"));
    model_.assign(mine_);
    return OkStatus();
  }

  Status step(int thread, std::span<const float> grad, uint64_t step, uint64_t samples) override {
    COFAB_RETURN_IF_ERROR(checkStep(thread, grad));
    localSgd(0, grad);
    steps_.fetch_add(1);
    globalSamples_.fetch_add(samples * uint64_t(env_.worldSize));
    if ((step + 1) % uint64_t(options_.syncEvery) != 0) return OkStatus();
    const uint64_t round = round_++;
    int p = gossipPeer(env_.rank, env_.worldSize, round, options_.gossipPeers == "random",
                       options_.seed);
    if (p < 0) return OkStatus();
    model_.read(mine_);
    TensorView mine(mine_.data(), total_, DType::kF32), theirs(peer_.data(), total_, DType::kF32);
    // Each wait its own timeoutMs, as a deadline (deadline(): Deadline::afterMs saturates, where
    // a Duration in nanoseconds overflowed to a negative timeout, which the collectives read as
    // unset: COFAB_COLLECTIVE_TIMEOUT_MS).
    auto sendMine = [&] {
      comm::CollectiveOptions o;
      o.deadline = deadline();
      return comm::send(*env_.comm, mine, p, o);
    };
    auto recvTheirs = [&] {
      comm::CollectiveOptions o;
      o.deadline = deadline();
      return comm::recv(*env_.comm, theirs, p, o);
    };
    // The lower rank sends first so that the pair never waits on each other.
    const bool sendFirst = env_.rank < p;
    Status st = sendFirst ? sendMine() : recvTheirs();
    if (st.ok()) st = sendFirst ? recvTheirs() : sendMine();
    if (!st.ok()) {
      return st.withContext("sync gossip: step " + std::to_string(step) + ", round " +
                            std::to_string(round) + ": exchanging the model with rank " +
                            std::to_string(p));
    }
    for (size_t i = 0; i < total_; ++i) peer_[i] -= mine_[i];
    model_.add(peer_, 0.5f);  // x += (x_peer - x) / 2
    syncs_.fetch_add(1);
    bytesSent_.fetch_add(total_ * sizeof(float));
    bytesReceived_.fetch_add(total_ * sizeof(float));
    return OkStatus();
  }

  Status finish(std::span<float> out) override {
    if (env_.comm == nullptr) return FailedPrecondition("sync gossip: start() not called");
    // start() failed on its layout (setUp() never records an empty one): no model to average.
    if (total_ == 0) return FailedPrecondition("sync gossip: start() not called or failed");
    model_.read(mine_);
    COFAB_RETURN_IF_ERROR(comm::allreduce(*env_.comm, TensorView(mine_.data(), total_, DType::kF32),
                                          collective(comm::ReduceOp::kAvg))
                              .withContext("sync gossip: finish(): averaging the final models"));
    model_.assign(mine_);
    return readFinal(out);
  }

 private:
  comm::AllreduceOptions collective(comm::ReduceOp op) const {
    comm::AllreduceOptions o;
    o.op = op;
    o.deadline = deadline();  // see step()
    return o;
  }

  std::vector<float> mine_, peer_;
  uint64_t round_ = 0;
};

}  // namespace
}  // namespace cofab::sync::detail

namespace cofab::sync {

int gossipPeer(int r, int w, uint64_t round, bool random, uint64_t seed) {
  if (w < 2 || r < 0 || r >= w) return -1;
  if (random) {
    std::vector<int> perm(static_cast<size_t>(w));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed * 7919u + round));
    size_t at = size_t(std::find(perm.begin(), perm.end(), r) - perm.begin());
    size_t other = at ^ 1u;
    return other < size_t(w) ? perm[other] : -1;
  }
  auto ringPeer = [&](int x) {
    bool pairsRight = (x % 2) == int(round % 2);
    return ((pairsRight ? x + 1 : x - 1) + w) % w;
  };
  int p = ringPeer(r);
  // Odd w: the wrap-around would pair a rank with one already paired; it sits out.
  if (p == r || ringPeer(p) != r) return -1;
  return p;
}

}  // namespace cofab::sync

namespace cofab::sync::detail {

StatusOr<AlgorithmPtr> makeGossipSync(const SyncOptions& options, const SyncEnv& env) {
  return AlgorithmPtr(new GossipSync(options, env));
}

}  // namespace cofab::sync::detail
