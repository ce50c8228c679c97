// SyncAlgorithm: how the workers of a data-parallel job keep their models consistent, picked with
// one option (SyncOptions::algorithm) and made by makeSyncAlgorithm():
//
//   sync        BSP: gradients averaged through the aggregators' push-pull every step (reference)
//   int8,onebit sync with compressed push-pull (8-bit min-max per block; 1-bit sign + scale with
//               error feedback)
//   ssp         bounded-staleness asynchronous parameter server (ps::ModelClient): staleness in
//               model versions (default: stale updates dropped, nobody waits) or in clocks (SSP:
//               a fast worker waits for the slowest), SyncOptions::stalenessUnit
//   shadowsync  training never waits for the network; a background thread averages the models
//               (push-pull average, or EASGD with shadowMode "easgd") at its own pace
//   easgd       local SGD + elastic averaging with a center variable on the aggregators
//   eawild      several Hogwild threads per worker on one shared model + elastic averaging
//   gossip      decentralized: pairwise model averaging with ring or random peers, no aggregator
//   gradcode    sync with gradient coding (fractional repetition, docs/CODED.md): every worker
//               computes the gradients of s+1 data partitions, the daemons (cofab-aggd
//               --gradient-stragglers s) complete a round on one contribution per group of s+1
//               workers, so up to s stragglers are not waited for; the result is the full sum,
//               and a straggler catches up on the rounds it missed without computing them
//
// The algorithm owns the worker's model (the optimizer, SGD with momentum, runs inside step():
// on the averaged gradient for sync/int8/onebit, on the local gradient for the parameter-based
// algorithms, as a delta sent to the parameter server for ssp). The training loop only computes
// gradients on what read() gives it:
//
//   auto algo = sync::makeSyncAlgorithm({.algorithm = "easgd", .lr = 0.05f}, env);
//   COFAB_RETURN_IF_ERROR((*algo)->start(initialParams, {w1Count, b1Count, ...}));
//   for (step...) { (*algo)->read(0, params); grad = meanGradient(params, batch);
//                   COFAB_RETURN_IF_ERROR((*algo)->step(0, grad, step, batchSize)); }
//   COFAB_RETURN_IF_ERROR((*algo)->finish(finalParams));
//
// Gradients passed to step() are the mean over the thread's own mini-batch (gradcode: the sum,
// over the worker's partitions(), of each partition's mean; see partitions() and needsGradient()).
// Every worker of the job calls start() and finish() (collective) and uses the same options and
// tensor layout.
//
// Threads: threads() training threads (1 except for eawild) call read() and step() with their
// own index concurrently; start(), finish() and stats() from the thread that made the algorithm.
// Algorithms with a background thread (shadowsync) start it in start() and join it in finish().
// The environment (store, communicator) is owned by the caller and outlives the algorithm.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "fabric/comm/communicator.h"
#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/store.h"

namespace cofab::sync {

struct SyncOptions {
  std::string algorithm = "sync";  // one of syncAlgorithms()
  float lr = 0.05f;
  float momentum = 0.9f;
  // eawild: Hogwild training threads per worker sharing one model.
  int threads = 1;
  // easgd/eawild: local steps between elastic updates; gossip: steps between gossip rounds.
  int syncEvery = 1;
  // easgd/eawild/shadowsync(easgd): elastic coefficient alpha (center and worker move by
  // alpha * (x - center)). 0: 0.9 / worldSize (beta = 0.9 in the EASGD paper's notation).
  float elasticAlpha = 0.0f;
  // gossip: "ring" (alternating left/right neighbour) or "random" (a random pairing each round,
  // the same on every worker).
  std::string gossipPeers = "ring";
  // shadowsync: "average" (push-pull average of the models) or "easgd" (elastic with the center).
  std::string shadowMode = "average";
  // shadowsync: the background thread starts a round at most every this many ms (0: back to back).
  int64_t shadowIntervalMs = 0;
  // int8/onebit: elements per compression block (one scale / min-max each); 0: the codec's
  // default (compress::kDefaultBlock).
  size_t compressionBlock = 0;
  // ssp: "versions" (each update carries the model version it was computed on; the daemons drop
  // it when more than their --version-staleness updates were applied since; fast workers never
  // wait) or "clocks" (SSP: a worker more than the daemons' --staleness clocks ahead of the
  // slowest waits). docs/SYNC.md says when to use which.
  std::string stalenessUnit = "versions";
  // gradcode: s, the stragglers tolerated; s+1 must divide the workers, and the daemons must run
  // with the same --gradient-stragglers s (start() checks).
  int gradientStragglers = 1;
  // gradcode: rounds a straggler may fall behind and still catch up (the daemons keep the last
  // `gradcodeWindow` rounds' results on keys of their own: memory = window x model per job).
  int gradcodeWindow = 16;
  // onebit: the daemons also keep error feedback for the replies they recompress
  // (ps::PushPullOptions::replyFeedback). Off by default: it costs accuracy (docs/COMPRESSION.md).
  bool replyFeedback = false;
  // onebit: the workers quantize the Nesterov look-ahead step (grad + momentum * v) instead of
  // the velocity v. On by default: on the Fashion-MNIST MLP it ends 0.4 points below sync on
  // average over 4 seeds instead of 1.1 (docs/COMPRESSION.md "Nesterov look-ahead").
  bool onebitNesterov = true;
  uint64_t seed = 1;
  // Every wait (a push-pull, a PS call, a gossip exchange) fails after this long. Longer than
  // cofab-aggd's --round-timeout-ms default (120 s): a round missing a worker then fails on the
  // daemon first, with an error that names the worker; the worker's own deadline, started before
  // its push, would come first and could only say which chunks were still missing.
  int64_t timeoutMs = 150000;
};

struct SyncStats {
  uint64_t steps = 0;  // step() calls, all threads
  uint64_t syncs =
      0;  // synchronization rounds (push-pulls, applies, elastic updates, gossip rounds)
  uint64_t bytesSent = 0;  // payload bytes this worker sent (after compression)
  uint64_t bytesReceived = 0;
  uint64_t staleUpdates = 0;    // ssp: applies that waited or saw staleness > 0
  uint64_t maxStaleness = 0;    // ssp: largest staleness the parameter server reported
  double meanStaleness = 0;     // ssp: over all applies
  uint64_t dropped = 0;         // ssp: updates (tensors) the server dropped as too stale
  uint64_t droppedSamples = 0;  // ssp: samples of the steps with a dropped update (not counted
                                // in globalSamples())
  double syncsPerSecond = 0;    // achieved synchronization frequency (shadowsync), since start()
  double stepsPerSync = 0;      // local steps per synchronization round
  uint64_t skipped = 0;         // gradcode: rounds completed without this worker (not computed)
};

// What the algorithms connect through; owned by the caller.
struct SyncEnv {
  int rank = 0;
  int worldSize = 1;
  // Aggregator discovery for every algorithm but gossip (or client.serverAddresses).
  Store* store = nullptr;
  ps::ClientOptions client;
  // gossip: the peers.
  comm::Communicator* comm = nullptr;
};

class SyncAlgorithm {
 public:
  virtual ~SyncAlgorithm() = default;
  virtual std::string name() const = 0;
  // Number of training threads that call read()/step() (options.threads for eawild, else 1).
  virtual int threads() const { return 1; }
  // Collective. `initial` is the model (all workers should pass the same one; the algorithms
  // make them agree anyway), split into tensors of `tensorCounts` floats (one PS key each).
  virtual Status start(std::span<const float> initial, const std::vector<size_t>& tensorCounts) = 0;
  // Copies thread `thread`'s current view of the model into `out`, which must hold exactly the
  // model; after a successful start(). Anything else aborts with a message (a caller's bug).
  virtual void read(int thread, std::span<float> out) = 0;
  // Thread `thread` computed `grad` (mean over its `samples` samples) on what read() gave it,
  // for its step number `step` (0, 1, 2, ... per thread). Updates the model as the algorithm does.
  // `samples` counts one partition's samples.
  virtual Status step(int thread, std::span<const float> grad, uint64_t step, uint64_t samples) = 0;
  // The data partitions, of worldSize, whose gradients this worker computes at every step:
  // {rank} (its own samples) for every algorithm but gradcode, whose workers compute the s+1
  // partitions of their group. The loop must draw partition p's samples from a stream that
  // depends on p only (not on the rank), so the replicas of a partition agree, and pass step()
  // the sum of the partitions' mean gradients.
  virtual std::vector<int> partitions() const = 0;
  // Whether step `step` (of thread `thread`) still needs this worker's gradient. false when the
  // round was completed without it (a gradcode straggler catching up): the loop then skips the
  // computation, advances its sample streams as if it had drawn the step's samples, and calls
  // step() with an empty gradient, which applies the round's result. Always true for the others.
  virtual StatusOr<bool> needsGradient(int /*thread*/, uint64_t /*step*/) { return true; }
  // Samples processed by all workers of the job so far, as far as this worker knows (sync, int8,
  // onebit, gossip and gradcode take this rank's `samples` x the number of workers: exact when
  // every rank passes the same count to each step(), as a loop ending its epochs on this value
  // must; for the others at the last publication, exact after finish(); ssp counts only the samples
  // of steps whose updates were all applied). Lets a loop end an epoch on global progress so
  // fast workers do more of the work than slow ones.
  virtual uint64_t globalSamples() const = 0;
  // Collective: stops training and writes the job's final model into `out` (the average, the
  // center, or the parameter server's copy). `out` must hold exactly the model: otherwise
  // InvalidArgument (after the collective part, so that the others are not left waiting).
  virtual Status finish(std::span<float> out) = 0;
  virtual SyncStats stats() const = 0;
};

StatusOr<std::unique_ptr<SyncAlgorithm>> makeSyncAlgorithm(const SyncOptions& options,
                                                           const SyncEnv& env);
// "sync, ssp, shadowsync, easgd, eawild, gossip, int8, onebit, gradcode"
std::string syncAlgorithms();
bool isSyncAlgorithm(const std::string& name);
// Whether the algorithm needs aggregator daemons (all but gossip) / a communicator (gossip).
bool needsAggregators(const std::string& algorithm);

}  // namespace cofab::sync
