// Coded shuffling over the network through an aggregator daemon's fan-out.
//
// coding/shuffle/coded_shuffle.h plans an epoch: multicast messages, each the XOR of rows wanted
// by t+1 workers. Unicast would make the master send each message t+1 times and lose the gain;
// here the master uploads every message once to a cofab-aggd (a push with ps::kPushFanOut: the
// upload is the round's result as it is) and every worker that needs it pulls it from the daemon,
// so the master's egress is messages x rowBytes (coded) instead of neededRows x rowBytes
// (uncoded: one fan-out per needed row, pulled by its one worker).
//
// Addressing: message m of epoch e is key base(e) + m (a key range per epoch and per mode), chunk
// 0 of 1, iteration 0, dtype f32 (rowBytes must be a multiple of 4). Each upload is the row
// followed by an 8-byte tag of the plan it was built from (shufflePlanTag): a worker whose plan
// differs from the master's (other CodedShuffle options, another rowBytes) fails its pull naming
// the mismatch instead of XOR-decoding garbage with OK. The master connects as
// worker rank n of a daemon started with --workers n+1; worker w as rank w. Order: the master's
// upload() returns once the daemon acknowledged every message; workers pull afterwards (a daemon
// answers a pull for a finished round from its result), so the caller sequences epochs (e.g.
// through the store). Once every worker has received an epoch, the master releases it
// (shuffleReleaseEpoch: ControlOp::kFanOutRelease), and the daemon frees its slots, so a long
// run holds at most the epochs not yet released; a pull after the release is rejected as
// released. Fan-out pushes are not replicated.
//
// Ownership: each endpoint owns its transport context and connection. Threads: one thread at a
// time per endpoint; replies arrive on the transport's I/O thread into the endpoint's queue.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "coding/shuffle/coded_shuffle.h"
#include "core/clock.h"
#include "core/status.h"
#include "fabric/transport/context.h"

namespace cofab::coded {

class ShuffleEndpoint {
 public:
  // Connects to the daemon at `address` as "worker <rank>".
  static StatusOr<std::unique_ptr<ShuffleEndpoint>> connect(const std::string& address, int rank,
                                                            Deadline deadline,
                                                            const std::string& transport = "tcp");
  ~ShuffleEndpoint();
  ShuffleEndpoint(const ShuffleEndpoint&) = delete;
  ShuffleEndpoint& operator=(const ShuffleEndpoint&) = delete;

  // Master: uploads `count` messages (rows of `messages`, rowBytes each, each followed by
  // `planTag`) as keys keyBase.. of iteration `epoch`, each once; waits for every
  // acknowledgement (a rejection is an error naming the daemon's reason). Returns the bytes this
  // endpoint sent (headers + payloads).
  StatusOr<uint64_t> upload(uint64_t epoch, uint64_t keyBase, std::span<const uint8_t> messages,
                            size_t rowBytes, uint64_t planTag, Deadline deadline);

  // Master: tells the daemon that every puller has received keys [keyBase, keyBase + count):
  // it frees their fan-out slots. Returns once the daemon acknowledged.
  Status release(uint64_t keyBase, uint64_t count, Deadline deadline);

  // Worker: pulls keys keyBase + offsets[i] of iteration `epoch` into row i of `out`.
  // InvalidArgument when a row has another size than rowBytes, FailedPrecondition when it was
  // uploaded with another plan tag (both name the key and the two values).
  Status pull(uint64_t epoch, uint64_t keyBase, std::span<const int64_t> offsets, size_t rowBytes,
              uint64_t planTag, std::span<uint8_t> out, Deadline deadline);

  struct Reply;

 private:
  // One kFanOutRelease request (count <= ps::kMaxFanOutReleaseKeys) and its answer.
  Status releaseOnce(uint64_t keyBase, uint64_t count, Deadline deadline);
  ShuffleEndpoint() = default;
  void postRecv();
  StatusOr<Reply> next(Deadline deadline);

  int rank_ = -1;
  std::shared_ptr<transport::Context> ctx_;
  std::shared_ptr<transport::Connection> conn_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Reply> replies_;  // under mu_
  Status error_;               // under mu_
  // release() tags its request with a sequence no upload or pull uses (those send 0), so that
  // only the daemon's answer to that release (which echoes it) ends the wait.
  uint64_t releases_ = 0;
};

struct ShuffleEpochStats {
  uint64_t masterEgressBytes = 0;  // headers + payloads (rows and plan tags) the master sent
  uint64_t payloadBytes = 0;       // the rows only (messages x rowBytes)
  int64_t messages = 0;            // uploads
};

// The bytes of plan tag after each uploaded row.
inline constexpr size_t kShufflePlanTagBytes = 8;
// A fingerprint of everything that decides what a message holds: the shuffle's shape (workers,
// t, rows), the plan (epoch, batches, sources, messages), the mode and rowBytes.
uint64_t shufflePlanTag(const coding::CodedShuffle& shuffle, const coding::ShufflePlan& plan,
                        bool coded, size_t rowBytes);

// Epochs every multicast path can address: [0, kShuffleEpochLimit). The relay gives an epoch and
// mode 2^32 keys (epoch in key bits 32..61, mode in bit 62); the broadcast path's frames carry
// epoch << 1 | coded in 32 bits. Past the limit two epochs would share keys or tags, and a daemon
// still holding the older one would take the newer upload for a resend.
inline constexpr int64_t kShuffleEpochLimit = int64_t{1} << 30;

// InvalidArgument unless plan.epoch is in [0, kShuffleEpochLimit) and the plan's batch and source
// lists have one shape (ShufflePlan is a plain struct; every path below checks it first).
Status shuffleCheckPlan(const coding::ShufflePlan& plan);

// What each worker pulls in an epoch (message offsets), coded or uncoded, and how its batch is
// rebuilt; the same functions on the master and the workers, so their numbering agrees. Empty for
// a plan shuffleCheckPlan() refuses.
//   coded:   the plan's messages; worker w pulls those naming w, decodes with its cache
//   uncoded: one message per (worker, needed row), in worker-then-batch order
std::vector<int64_t> shuffleOffsetsFor(const coding::ShufflePlan& plan, int worker, bool coded);

// Master side of one epoch: the uploads (coded: encode the plan; uncoded: the needed rows).
StatusOr<ShuffleEpochStats> shuffleUploadEpoch(ShuffleEndpoint& master,
                                               const coding::CodedShuffle& shuffle,
                                               const coding::ShufflePlan& plan, bool coded,
                                               std::span<const uint8_t> data, size_t rowBytes,
                                               Deadline deadline);

// Master side, after every worker's shuffleReceiveEpoch() of the epoch returned: frees the
// epoch's uploads on the daemon.
Status shuffleReleaseEpoch(ShuffleEndpoint& master, const coding::ShufflePlan& plan, bool coded,
                           Deadline deadline);

// Worker side of one epoch: pulls what it needs and fills batchOut (plan.batch[worker] order).
Status shuffleReceiveEpoch(ShuffleEndpoint& worker, const coding::CodedShuffle& shuffle,
                           const coding::ShufflePlan& plan, bool coded,
                           const coding::WorkerCache& cache, size_t rowBytes,
                           std::span<uint8_t> batchOut, Deadline deadline);

// Shared with the other multicast paths (shuffle_broadcast.h), so that every path numbers and
// decodes messages the same way:
// the epoch's messages in shuffleOffsetsFor() numbering (rows of rowBytes);
StatusOr<std::vector<uint8_t>> shuffleEpochMessages(const coding::CodedShuffle& shuffle,
                                                    const coding::ShufflePlan& plan, bool coded,
                                                    std::span<const uint8_t> data, size_t rowBytes);
// a worker's batch from its cache and the messages it received (row i = message offsets[i]).
Status shuffleBuildBatch(const coding::CodedShuffle& shuffle, const coding::ShufflePlan& plan,
                         bool coded, const coding::WorkerCache& cache, size_t rowBytes,
                         std::span<const int64_t> offsets, std::span<const uint8_t> received,
                         std::span<uint8_t> batchOut);

}  // namespace cofab::coded
