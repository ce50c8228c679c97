// PushPullClient: a worker's connection to the aggregator daemons (cofab-aggd), and the
// push-pull operation that sums (or averages) one tensor across every worker of the job.
//
//   auto client = ps::PushPullClient::connect(*store, rank, worldSize, {});
//   ps::PushPullHandle h = (*client)->pushPull(/*key=*/7, grad, grad, {});   // in place is fine
//   ... compute the next layer's gradient while h is in flight ...
//   COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(30000)));
//
// How a worker finds the aggregators: every daemon i of M (cofab-run --role agg:M:cofab-aggd)
// sets "<storePrefix>/server/<i>" to its transport address and "<storePrefix>/count" to M in the
// job's Store; connect() waits for those keys (or takes ClientOptions::serverAddresses instead)
// and opens one connection per daemon. All workers of a job must use the same chunkBytes and
// server list: the placement of a chunk on a daemon is computed by every worker independently
// (fabric/ps/placement.h), never negotiated.
//
// Contract of pushPull(key, in, out, options):
//   - every worker of the job calls it for the same key with the same count and dtype (f32, f64,
//     f16, bf16) once per iteration; `out` receives the sum (or average) over all workers, for
//     f16/bf16 accumulated in f32, in the reduction order of docs/AGGREGATOR.md, so that every
//     worker gets bit-identical results and a rerun (also one with a failover) gets the same bits;
//   - the caller owns `in` and `out` and lends them until the handle completes; they may be
//     the same buffer (in-place) or disjoint, never partially overlapping (InvalidArgument: one
//     chunk's result would overwrite another's input), and `in` is read again if a chunk has to
//     be resent after a failover. A handle completes only once no send still reads `in` and no
//     receive still writes `out`, also when it fails early (a reject, a failed round): a push
//     queued behind a slow daemon holds the handle open until the transport has taken its
//     bytes;
//   - a (key, iteration) still in flight on this client is refused (FailedPrecondition)
//     before any of its chunks is sent, and so is any call once close() has begun (Cancelled);
//   - the call returns at once; many calls may be in flight (batch them: one per layer, and wait
//     on the handles when the results are needed) so communication overlaps compute;
//   - iterations: by default the client numbers successive pushPull calls on one key 0, 1, 2...
//     (PushPullOptions::iteration overrides, and automatic numbering continues after the
//     highest given; reserveIteration() takes a number ahead); a daemon rejects a chunk for a
//     finished iteration or one beyond its window, a wrong size or dtype, or an unknown worker,
//     and the handle then fails with the daemon's reason;
//   - errors are sticky per client: after the first failed operation (a daemon released a round
//     because a worker died, a daemon is gone and has no backup, both daemons of a replica
//     pair are gone, ...) every pending and later operation fails with that Status.
//
// Threads: pushPull(), waitAll() and close() may be called from any thread. Completion happens
// on the transport's I/O threads (results are received straight into `out`, or copied there for
// compressed chunks); handles are polled or
// waited on by the caller, there are no user callbacks. The client and its handles are
// independent objects: a handle outlives the client (it then fails with Cancelled).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fabric/compress/codec.h"
#include "fabric/rendezvous/store.h"
#include "fabric/transport/inproc_pipe.h"

namespace cofab::ps {

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,  // sum (in the documented order), then divided by the number of workers
};

// How the result comes back.
enum class Delivery : uint8_t {
  kPushBack = 0,  // the daemon sends the result to every contributor when the round completes
  kPull = 1,      // the worker asks for it with a PULL message (sent right after the push)
  // Only the PULL: fetch the round's result without contributing (`in` is not read; pass `out`
  // as both). The daemon answers at once for the round just finished, holds the pull until the
  // open round completes, and rejects older rounds as finished. Uncompressed only. For a worker
  // that catches up on rounds completed without it (gradient coding, fabric/sync gradcode).
  kPullOnly = 2,
};

inline constexpr uint64_t kAutoIteration = ~0ull;

// Compression of the chunks on the wire (f32 only; docs/COMPRESSION.md): kNone, kInt8 (8-bit
// min-max per block), kOneBit (sign + per-block scale, error feedback kept per key by the client;
// per slot by the daemon only with replyFeedback). The daemon decompresses, sums in f32 in rank
// order, recompresses.
using Compression = compress::Compression;

struct PushPullOptions {
  ReduceOp op = ReduceOp::kSum;
  Delivery delivery = Delivery::kPushBack;
  // The round this contribution belongs to; kAutoIteration: the client's per-key counter.
  uint64_t iteration = kAutoIteration;
  Compression compression = Compression::kNone;       // kNone, kInt8, kOneBit (f32 tensors only)
  size_t compressionBlock = compress::kDefaultBlock;  // elements per block (scale/min)
  // kOneBit only: the daemon recompresses the result with error feedback of its own (a residual
  // per (key, chunk), "DoubleSqueeze"). Off by default: on the Fashion-MNIST MLP it costs ~10
  // points of accuracy (docs/COMPRESSION.md). Every worker of a key must agree.
  bool replyFeedback = false;
  // Optional hook for schedulers (fabric/transfer): called exactly once, with OK when every chunk
  // of this operation has been acknowledged by its daemon (applied there, independent of the
  // other workers), or with the failure if the operation ends before that. Runs on a transport
  // I/O thread (or inside pushPull on an argument error) possibly under client locks: it must
  // not block and must not call into the client.
  std::function<void(const Status&)> onAcked;
  // Optional, same rules: called exactly once when the operation finishes (after `out` was
  // written), with its final Status.
  std::function<void(const Status&)> onDone;
};

struct ClientOptions {
  // Transport backend by name (Registry). Empty: COFAB_PS_TRANSPORT (default "tcp").
  std::string transport;
  // Store namespace the daemons registered under (cofab-aggd --store-prefix).
  std::string storePrefix = "cofab/agg";
  // Static daemon addresses instead of the store (index = daemon id). Empty: read the store.
  std::vector<std::string> serverAddresses;
  // Chunk size in bytes; 0: COFAB_PS_CHUNK_BYTES (default 4 MiB). Same on every worker. At
  // most 1 GiB (a message's payload limit); more is InvalidArgument at connect.
  size_t chunkBytes = 0;
  // Replication on: every chunk has a backup daemon ((primary + 1) % M) that the primary
  // forwards to before acknowledging; on the primary's death the client fails over to it.
  // -1: COFAB_PS_REPLICATION (default off). Must match the daemons' --replication.
  int replication = -1;
  // A daemon with operations outstanding that has sent nothing for this long is pinged. One whose
  // connection breaks is declared dead; with replication, so is one that stays silent for
  // failoverMs (at least 2 x heartbeatMs, else InvalidArgument), and its chunks fail over.
  // Without replication a silent daemon fails nothing by itself: the handles' waits end at
  // their deadlines, naming the chunks and aggregators still missing. 0: the params
  // COFAB_PS_HEARTBEAT_MS (default 500) and COFAB_PS_FAILOVER_MS (default 3000).
  int64_t heartbeatMs = 0;
  int64_t failoverMs = 0;
  // All of connect(): the daemons registering, accepting and (credits on) granting a window.
  int64_t connectTimeoutMs = 60000;
  // Receiver-driven credits (cofab-aggd --credit-bytes): a daemon that granted a window
  // (ControlOp::kCredit) gets at most that many unacknowledged payload bytes from this client
  // (one chunk always may go when nothing is outstanding); further chunks wait in a per-daemon
  // FIFO queue until acks return credit. -1: COFAB_PS_CREDITS (default off). On: connect()
  // waits for every daemon's grant, so even the first chunks respect it. Off: grants are
  // honoured from the moment they arrive.
  int credits = -1;
  // Colocated shards hosted in this process (aggregator::AggregatorServer::connectInProcess):
  // daemon index -> its in-process connection, used instead of dialling that daemon's address
  // (serverAddresses or the store still list every daemon). Saves the sockets, not the protocol.
  std::vector<std::pair<int, std::shared_ptr<transport::PipeEnd>>> inProcess;
};

struct ClientStats {
  uint64_t chunksPushed = 0;
  uint64_t chunksResent = 0;  // after a failover
  uint64_t bytesOut = 0;
  uint64_t bytesIn = 0;
  uint64_t failovers = 0;
  uint64_t creditStalls = 0;  // chunks that had to wait in a per-daemon queue for credit
};

namespace detail {
struct OpState;
}

// Completion of one pushPull. Copyable (shared state); a default-constructed handle is invalid.
class PushPullHandle {
 public:
  PushPullHandle() = default;
  explicit PushPullHandle(std::shared_ptr<detail::OpState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  // True once the operation finished (successfully or not). Never blocks.
  bool test() const;
  // Waits until finished or `deadline`: the operation's Status, or DeadlineExceeded naming the
  // key, the iteration and the chunks (and daemons) still missing. The operation keeps running
  // after a DeadlineExceeded; wait again or close the client.
  Status wait(Deadline deadline) const;
  // The final Status once finished; Unavailable("in progress") before.
  Status status() const;

 private:
  std::shared_ptr<detail::OpState> state_;
};

class PushPullClient {
 public:
  // Discovers the daemons (store or options.serverAddresses), connects to each (as
  // "worker <rank>"), and returns a ready client. DeadlineExceeded naming the daemons that did
  // not register or accept within connectTimeoutMs.
  static StatusOr<std::unique_ptr<PushPullClient>> connect(Store& store, int rank, int worldSize,
                                                           const ClientOptions& options = {});
  // Same, only with options.serverAddresses (no store).
  static StatusOr<std::unique_ptr<PushPullClient>> connect(int rank, int worldSize,
                                                           const ClientOptions& options);

  ~PushPullClient();  // close()
  PushPullClient(const PushPullClient&) = delete;
  PushPullClient& operator=(const PushPullClient&) = delete;

  // Starts one push-pull (contract above). Argument errors complete the handle at once.
  PushPullHandle pushPull(uint64_t key, TensorView in, TensorView out,
                          const PushPullOptions& options = {});

  // Waits for every operation started so far: the first failure, or DeadlineExceeded naming
  // what is missing. Operations that finished (or were refused) before the call count too,
  // however long ago; each failure is returned by one waitAll() only, so a later call reports
  // only what failed since.
  Status waitAll(Deadline deadline);

  // OK, or the sticky error that failed the client.
  Status status() const;
  // Fails pending operations with Cancelled, says goodbye to the daemons, closes the transport.
  // Idempotent.
  void close();

  // The iteration the next automatically numbered pushPull of `key` would get, taken now: for a
  // caller that numbers operations when it queues them and may drop some before they start (the
  // TransferManager), so that later ones still go to the rounds the other workers send them to.
  // Automatic numbering continues after it. Any thread; takes only a leaf lock.
  uint64_t reserveIteration(uint64_t key);

  // The daemon that chunk `chunk` of `key` goes to now: its placement's primary, or the backup
  // once the client failed over from the primary (which placement.h alone cannot say). Any
  // thread, lock-free: for a caller that books per-daemon load under its own lock (the
  // TransferManager's central grants).
  int currentServer(uint64_t key, uint32_t chunk = 0) const;

  int rank() const;
  int worldSize() const;
  int numServers() const;
  size_t chunkBytes() const;
  ClientStats stats() const;

  class Impl;

 private:
  explicit PushPullClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Waits for every handle until `deadline`, also after one failed (a reject fails only its own
// operation), so that when this returns no operation still reads or writes the memory it was
// lent. One still running at the deadline (a handle keeps running after a DeadlineExceeded) is
// cancelled by closing `client`, which joins its I/O threads: the client is then unusable
// (status() not OK, every later pushPull fails), and the caller must fail for good (latch the
// error). OK, or the first failure in handle order, whose index goes to *failedIndex when given.
// Any thread; the handles must come from `client`.
Status waitEveryHandle(PushPullClient& client, std::span<const PushPullHandle> handles,
                       Deadline deadline, size_t* failedIndex = nullptr);

}  // namespace cofab::ps
