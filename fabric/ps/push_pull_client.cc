// PushPullClient implementation. One mutex (mu_) guards the table of chunks in flight and the
// daemon states; it is held only to look up or update an entry (never across a wait), and the
// transport never calls back inline, so sending under it cannot deadlock. Results are received
// straight into the caller's `out` (Connection::recvRouted, routeResult below), and pushes are
// sent straight from its `in`. An op with such a transport operation in flight does not complete
// before it ends (OpState::beginIo/endIo), so a failure elsewhere (a reject, a failed round, a
// dead daemon) cannot hand `in` or `out` back while the transport still reads or writes them.
#include "fabric/ps/push_pull.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "core/param.h"
#include "fabric/ps/daemon_directory.h"
#include "fabric/ps/placement.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/transport/registry.h"

namespace cofab::ps {

COFAB_PARAM_STRING(kPsTransport, "COFAB_PS_TRANSPORT", "tcp",
                   "transport workers use to reach the aggregator daemons");
COFAB_PARAM_INT(kPsChunkBytes, "COFAB_PS_CHUNK_BYTES", 4 << 20, 64, 1 << 30,
                "push-pull chunk size in bytes (same on every worker)");
COFAB_PARAM_BOOL(kPsReplication, "COFAB_PS_REPLICATION", false,
                 "push-pull expects backup daemons and fails over to them");
COFAB_PARAM_INT(kPsHeartbeatMs, "COFAB_PS_HEARTBEAT_MS", 500, 1, 3600000,
                "ping a daemon that has been silent this long while chunks are outstanding");
COFAB_PARAM_BOOL(kPsCredits, "COFAB_PS_CREDITS", false,
                 "push-pull waits for every daemon's credit grant at connect (cofab-aggd "
                 "--credit-bytes) and never exceeds it");
COFAB_PARAM_INT(kPsFailoverMs, "COFAB_PS_FAILOVER_MS", 3000, 1, 3600000,
                "declare a silent daemon dead after this long (replication on)");

namespace detail {
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  uint64_t key = 0;
  uint64_t iteration = 0;
  uint32_t remaining = 0;
  std::vector<int> chunkServer;  // daemon holding each chunk; -1 once its result arrived
  // PushPullOptions::onAcked and the chunks not yet acknowledged.
  std::function<void(const Status&)> onAcked;
  std::function<void(const Status&)> onDone;
  uint32_t unacked = 0;
  // Transport operations on the caller's memory: pushes being sent from `in` and results being
  // received straight into `out` (routed receives). The op must not complete (the caller would
  // take its memory back) until they have ended. A finish() meanwhile is deferred to the last
  // endIo().
  int ioInFlight = 0;
  bool deferred = false;
  Status deferredStatus;
  // Its failure has been returned by a waitAll() or recorded for the next one (each failure
  // is reported once).
  bool reported = false;

  // The same, per daemon: a timed-out wait names the daemons whose connections hold them.
  std::map<int, int> ioByServer;

  void beginIo(int server) {
    std::lock_guard<std::mutex> lock(mu);
    ++ioInFlight;
    ++ioByServer[server];
  }
  void endIo(int server) {
    Status s;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = ioByServer.find(server); it != ioByServer.end() && --it->second == 0) {
        ioByServer.erase(it);
      }
      if (--ioInFlight > 0 || !deferred) return;
      deferred = false;
      s = std::move(deferredStatus);
    }
    finish(std::move(s));
  }

  // Returns false if the op had already finished (or a finish is already deferred).
  bool finish(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done || deferred) return false;
      if (ioInFlight > 0) {
        deferred = true;
        deferredStatus = std::move(s);
        return true;
      }
      done = true;
      status = std::move(s);
    }
    cv.notify_all();
    fireAcked(status);  // no-op if it already fired
    std::function<void(const Status&)> cb;
    {
      std::lock_guard<std::mutex> lock(mu);
      cb.swap(onDone);
    }
    if (cb) cb(status);
    return true;
  }
  // One chunk acknowledged: fires onAcked(OK) with the last one.
  void chunkAcked() {
    bool fire = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      fire = unacked > 0 && --unacked == 0;
    }
    if (fire) fireAcked(OkStatus());
  }
  void fireAcked(const Status& s) {
    std::function<void(const Status&)> cb;
    {
      std::lock_guard<std::mutex> lock(mu);
      cb.swap(onAcked);
    }
    if (cb) cb(s);
  }
};
}  // namespace detail

bool PushPullHandle::test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Status PushPullHandle::wait(Deadline deadline) const {
  if (!state_) return FailedPrecondition("wait() on an invalid PushPullHandle");
  std::unique_lock<std::mutex> lock(state_->mu);
  while (!state_->done) {
    if (state_->cv.wait_until(lock, deadline.when()) == std::cv_status::timeout && !state_->done) {
      std::ostringstream os;
      os << "push-pull key=" << state_->key << " iteration=" << state_->iteration << ": ";
      if (state_->deferred) {  // finished, but the transport still holds the caller's memory
        os << (state_->deferredStatus.ok() ? "every result is in"
                                           : "failed (" + state_->deferredStatus.toString() + ")")
           << ", and still waiting for " << state_->ioInFlight
           << " transport operation(s) on the caller's memory (pushes from `in`, results into "
              "`out`) to end, on";
        for (const auto& [server, n] : state_->ioByServer) {
          os << " aggregator " << server << " (" << n << ")";
        }
        return DeadlineExceeded(os.str());
      }
      os << state_->remaining << " of " << state_->chunkServer.size() << " chunks still missing:";
      int shown = 0;
      for (size_t c = 0; c < state_->chunkServer.size() && shown < 8; ++c) {
        if (state_->chunkServer[c] < 0) continue;
        os << " chunk " << c << " (aggregator " << state_->chunkServer[c] << ")";
        ++shown;
      }
      return DeadlineExceeded(os.str());
    }
  }
  return state_->status;
}

Status PushPullHandle::status() const {
  if (!state_) return FailedPrecondition("status() on an invalid PushPullHandle");
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done ? state_->status : Unavailable("in progress");
}

namespace {

struct ChunkId {
  uint64_t key;
  uint64_t iteration;
  uint32_t chunk;
  bool operator==(const ChunkId&) const = default;
};
struct ChunkIdHash {
  size_t operator()(const ChunkId& id) const {
    return mix64(id.key ^ mix64(id.iteration ^ (static_cast<uint64_t>(id.chunk) << 40)));
  }
};

struct Pending {
  std::shared_ptr<detail::OpState> op;
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  size_t bytes = 0;
  DType dtype = DType::kF32;
  uint32_t chunkCount = 0;
  uint8_t pushBits = 0;
  bool pull = false;
  bool push = true;  // false: Delivery::kPullOnly (no contribution, only the PULL)
  int server = 0;
  bool acked = false;
  // Compressed chunk: `in`/`bytes` are the encoding (kept for resends, so error feedback is
  // applied once), the answer is decoded into `count` floats at `out`.
  compress::Compression codec = compress::Compression::kNone;
  std::shared_ptr<std::vector<uint8_t>> encoded;
  size_t count = 0;
  bool ackCounted = false;  // counted towards the op's onAcked (once, even across a failover)
  bool writing = false;     // a routed receive is writing the result into `out`
  bool creditHeld = false;  // its bytes count against its daemon's credit window
};

struct ServerState {
  std::string address;
  std::shared_ptr<transport::Connection> conn;
  bool dead = false;
  size_t outstanding = 0;
  int64_t lastHeardNs = 0;
  int64_t lastPingNs = 0;
  // Credits (ControlOp::kCredit): window 0 = no grant, unlimited.
  bool granted = false;
  uint64_t creditWindow = 0;
  uint64_t creditUsed = 0;
  std::deque<ChunkId> creditQueue;  // chunks waiting for credit, in send order
  // The receive in progress on this connection was routed into this op's `out` (I/O thread;
  // the connection's receives complete one at a time).
  std::shared_ptr<detail::OpState> routedOp;
  ChunkId routedId{};
};

}  // namespace

class PushPullClient::Impl {
 public:
  Impl(int rank, int worldSize, ClientOptions options)
      : rank_(rank), worldSize_(worldSize), options_(std::move(options)) {}
  ~Impl() { close(); }

  Status start(const std::vector<std::string>& addresses, Deadline deadline) {
    transport::ContextOptions co;
    co.localId = workerPeerId(rank_);
    COFAB_ASSIGN_OR_RETURN(ctx_, transport::Registry::create(options_.transport, co));
    servers_.resize(addresses.size());
    deadNow_ = std::vector<std::atomic<bool>>(addresses.size());
    for (const auto& [index, end] : options_.inProcess) {
      if (index < 0 || static_cast<size_t>(index) >= addresses.size() || !end) {
        return InvalidArgument("ClientOptions::inProcess names daemon " + std::to_string(index) +
                               " of " + std::to_string(addresses.size()) +
                               (end ? "" : " with no connection"));
      }
    }
    for (size_t s = 0; s < addresses.size(); ++s) {
      bool local = false;
      for (const auto& [index, end] : options_.inProcess) {
        if (index != static_cast<int>(s) || !end) continue;
        servers_[s].address = addresses[s] + " (in-process)";
        servers_[s].conn = end;
        local = true;
      }
      if (local) continue;
      transport::ConnectOptions opts;
      opts.localId = workerPeerId(rank_);
      auto conn = ctx_->connect(addresses[s], opts, deadline);
      if (!conn.ok()) {
        return conn.status().withContext("worker " + std::to_string(rank_) +
                                         " connecting to aggregator " + std::to_string(s));
      }
      servers_[s].address = addresses[s];
      servers_[s].conn = std::move(conn).value();
    }
    for (size_t s = 0; s < servers_.size(); ++s) postRecv(static_cast<int>(s), servers_[s].conn);
    heartbeat_ = std::thread([this] { heartbeatLoop(); });
    if (credits_) {
      // Wait for every grant so the first chunks already respect the windows.
      std::unique_lock<std::mutex> lock(mu_);
      // A daemon lost meanwhile grants nothing: its backup serves its chunks (replication), or
      // everything failed (sticky_); either wakes this wait. The names only for the error.
      const auto waitingFor = [&] {
        std::string names;
        for (size_t s = 0; s < servers_.size(); ++s) {
          if (servers_[s].granted || servers_[s].dead) continue;
          names += (names.empty() ? "" : ", ") + serverName(static_cast<int>(s));
        }
        return names;
      };
      const auto answered = [&] {
        return std::all_of(servers_.begin(), servers_.end(),
                           [](const ServerState& sv) { return sv.granted || sv.dead; });
      };
      if (!stopCv_.wait_until(lock, deadline.when(), [&] { return !sticky_.ok() || answered(); })) {
        return DeadlineExceeded("worker " + std::to_string(rank_) + ": " + waitingFor() +
                                " sent no credit grant (COFAB_PS_CREDITS is on: run "
                                "cofab-aggd with --credit-bytes > 0, or turn it off)");
      }
      if (!sticky_.ok()) return sticky_;
    }
    return OkStatus();
  }

  PushPullHandle pushPull(uint64_t key, TensorView in, TensorView out,
                          const PushPullOptions& options) {
    auto op = std::make_shared<detail::OpState>();
    op->key = key;
    op->onAcked = options.onAcked;
    op->onDone = options.onDone;
    PushPullHandle handle(op);
    Status bad = validate(in, out, options);
    if (!bad.ok()) {
      op->finish(bad.withContext("pushPull key=" + std::to_string(key)));
      std::lock_guard<std::mutex> lock(mu_);
      noteUnwaitedLocked(*op);
      return handle;
    }
    const size_t esize = dtypeSize(in.dtype);
    const ChunkLayout layout = chunkLayout(in.count, esize, chunkBytes_);
    uint8_t bits = 0;
    if (options.op == ReduceOp::kAverage) bits |= kPushAverage;
    const bool pull = options.delivery != Delivery::kPushBack;
    if (!pull) bits |= kPushDeliver;
    if (options.compression == Compression::kInt8) bits |= kPushInt8;
    if (options.compression == Compression::kOneBit) bits |= kPushOneBit;
    if (options.replyFeedback) bits |= kPushReplyFeedback;
    // 1-bit error feedback: encoding moves the key's residual, so it may happen only for an op
    // that is accepted. The refusals (the client already failed, the (key, iteration) already
    // in flight) are checked before the encoding, and feedbackMu_ (taken before, never inside,
    // mu_) is held from those checks until the chunks are queued, so no other 1-bit pushPull
    // slips in between. Encoding runs without mu_ (the I/O threads need it for answers).
    std::unique_lock<std::mutex> feedbackLock;
    if (options.compression == Compression::kOneBit) {
      feedbackLock = std::unique_lock<std::mutex>(feedbackMu_);
    }
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t iteration = options.iteration;
    {
      std::lock_guard<std::mutex> l(iterationMu_);
      uint64_t& next = nextIteration_[key];
      if (iteration == kAutoIteration) {
        iteration = next++;
      } else {
        // Never backwards: iterations reserved and sent out of order (TransferManager) must not
        // hand out one of them again.
        next = std::max(next, iteration + 1);
      }
    }
    op->iteration = iteration;
    op->remaining = layout.chunkCount;
    op->unacked = layout.chunkCount;
    op->chunkServer.assign(layout.chunkCount, -1);
    if (finishedBeforeStartLocked(*op, key, iteration, layout.chunkCount)) return handle;
    std::vector<std::shared_ptr<std::vector<uint8_t>>> encoded;
    if (options.compression != Compression::kNone) {
      lock.unlock();
      encoded = compressChunks(key, in, layout, options, feedbackLock);
      lock.lock();
      // Again, for what may have changed meanwhile: the client failing (the op then fails like
      // one in flight would), or another thread sending this (key, iteration) without 1-bit.
      if (finishedBeforeStartLocked(*op, key, iteration, layout.chunkCount)) return handle;
    }
    ops_.push_back(op);  // (finishedBeforeStartLocked dropped the done ones)
    const int m = static_cast<int>(servers_.size());
    for (uint32_t c = 0; c < layout.chunkCount; ++c) {
      const size_t first = static_cast<size_t>(c) * layout.elementsPerChunk;
      const size_t n = std::min(layout.elementsPerChunk, in.count - first);
      Pending p;
      p.op = op;
      p.in = static_cast<const uint8_t*>(in.data) + first * esize;
      p.out = static_cast<uint8_t*>(out.data) + first * esize;
      p.bytes = n * esize;
      p.dtype = in.dtype;
      p.chunkCount = layout.chunkCount;
      p.pushBits = bits;
      p.pull = pull;
      p.push = options.delivery != Delivery::kPullOnly;
      if (options.compression != Compression::kNone) {
        p.codec = options.compression;
        p.count = n;
        p.encoded = encoded[c];
        p.in = p.encoded->data();
        p.bytes = p.encoded->size();
      }
      int server = primaryServer(key, c, m);
      if (servers_[static_cast<size_t>(server)].dead) server = backupServer(server, m);
      if (servers_[static_cast<size_t>(server)].dead) {
        failAllLocked(Unavailable("aggregators " + std::to_string(primaryServer(key, c, m)) +
                                  " and its backup " + std::to_string(server) + " are both gone"));
        op->finish(sticky_);  // no chunk of it may be in pending_ yet (failAllLocked's reach)
        return handle;
      }
      p.server = server;
      {
        std::lock_guard<std::mutex> l(op->mu);
        op->chunkServer[c] = server;
      }
      const ChunkId id{key, iteration, c};
      auto it = pending_.emplace(id, std::move(p)).first;  // free: checked above
      sendChunkLocked(id, it->second);
    }
    return handle;
  }

  uint64_t reserveIteration(uint64_t key) {
    std::lock_guard<std::mutex> l(iterationMu_);
    return nextIteration_[key]++;
  }

  Status waitAll(Deadline deadline) {
    std::vector<std::shared_ptr<detail::OpState>> ops;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ops = ops_;
    }
    std::vector<Status> waited;
    for (auto& op : ops) waited.push_back(PushPullHandle(op).wait(deadline));
    // Decided under mu_, where finished ops are also dropped from ops_ (and their failures
    // recorded in unreported_): each failure goes to exactly one waitAll().
    // Every failure it waited for counts as reported, not only the one returned: a later call
    // must not fail with an earlier step's second failure.
    std::lock_guard<std::mutex> lock(mu_);
    Status first = std::exchange(unreported_, OkStatus());
    for (size_t i = 0; i < ops.size(); ++i) {
      std::lock_guard<std::mutex> l(ops[i]->mu);
      if (!ops[i]->done) {
        if (first.ok()) first = waited[i];  // the wait's DeadlineExceeded, naming what is missing
      } else if (!ops[i]->status.ok() && !ops[i]->reported) {
        ops[i]->reported = true;
        if (first.ok()) first = ops[i]->status;
      }
    }
    return first;
  }

  // The failure of an op that never entered ops_ or has left it, for the next waitAll().
  void noteUnwaitedLocked(detail::OpState& op) {
    std::lock_guard<std::mutex> l(op.mu);
    if (!op.done || op.status.ok() || op.reported) return;
    op.reported = true;
    if (unreported_.ok()) unreported_ = op.status;
  }

  Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sticky_;
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      stop_ = true;
    }
    stopCv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
    if (!ctx_) return;
    // Say goodbye so the daemons do not mistake this orderly exit for a dead worker.
    std::vector<std::shared_ptr<std::atomic<bool>>> sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& s : servers_) {
        if (s.dead || !s.conn) continue;
        wire::Header h;
        h.type = wire::MessageType::kGoodbye;
        h.senderRank = static_cast<uint32_t>(rank_);
        auto flag = std::make_shared<std::atomic<bool>>(false);
        s.conn->send(h, nullptr, 0, [flag](const Status&) { flag->store(true); });
        sent.push_back(flag);
      }
    }
    const Deadline d = Deadline::afterMs(1000);
    for (auto& f : sent) {
      while (!f->load() && !d.expired()) std::this_thread::sleep_for(Millis(1));
    }
    ctx_->close();
    ctx_->join();
    // In-process shards run their callbacks on their pipe's thread, not the context's.
    for (const auto& [index, end] : options_.inProcess) {
      if (!end) continue;
      end->close();
      end->join();
    }
    std::lock_guard<std::mutex> lock(mu_);
    failAllLocked(Cancelled("push-pull client closed"));
  }

  size_t chunkBytes_ = 4 << 20;
  bool replication_ = false;
  bool credits_ = false;
  int64_t heartbeatMs_ = 500;
  int64_t failoverMs_ = 3000;

  int rank_;
  int worldSize_;
  ClientOptions options_;

  std::atomic<uint64_t> chunksPushed_{0}, chunksResent_{0}, bytesOut_{0}, bytesIn_{0},
      failovers_{0}, creditStalls_{0};
  std::vector<ServerState> servers_;
  // ServerState::dead, readable without mu_ (currentServer(): callers hold their own locks,
  // which mu_ must not nest in). Sized once in start().
  std::vector<std::atomic<bool>> deadNow_;

  int currentServer(uint64_t key, uint32_t chunk) const {
    const int m = static_cast<int>(deadNow_.size());
    if (m == 0) return 0;
    const int primary = primaryServer(key, chunk, m);
    return deadNow_[static_cast<size_t>(primary)].load() ? backupServer(primary, m) : primary;
  }

 private:
  Status validate(const TensorView& in, const TensorView& out, const PushPullOptions& o) {
    COFAB_RETURN_IF_ERROR(in.validate("in"));
    COFAB_RETURN_IF_ERROR(out.validate("out"));
    COFAB_RETURN_IF_ERROR(checkSameShape(in, out, "pushPull in/out"));
    // In place (in == out) is fine: each chunk's result replaces its own input. A partial
    // overlap is not: one chunk's result would overwrite another chunk's input before it is
    // sent (or resent after a failover).
    COFAB_RETURN_IF_ERROR(checkInPlaceOrDisjoint(in, out, "pushPull"));
    if (!in.device.isCpu() || !out.device.isCpu()) {
      return InvalidArgument("pushPull takes host tensors; got " + in.toString());
    }
    switch (in.dtype) {
      case DType::kF32:
      case DType::kF64:
      case DType::kF16:
      case DType::kBF16:
        break;
      default:
        return InvalidArgument("pushPull supports f32, f64, f16 and bf16; got " +
                               std::string(dtypeName(in.dtype)));
    }
    if (o.op != ReduceOp::kSum && o.op != ReduceOp::kAverage) {
      return InvalidArgument("unknown ReduceOp");
    }
    if (o.delivery != Delivery::kPushBack && o.delivery != Delivery::kPull &&
        o.delivery != Delivery::kPullOnly) {
      return InvalidArgument("unknown Delivery");
    }
    if (o.delivery == Delivery::kPullOnly && o.compression != Compression::kNone) {
      return InvalidArgument("a pull-only operation fetches uncompressed results only");
    }
    if (o.replyFeedback && o.compression != Compression::kOneBit) {
      return InvalidArgument("replyFeedback applies to kOneBit compression only");
    }
    if (o.compression != Compression::kNone) {
      if (o.compression != Compression::kInt8 && o.compression != Compression::kOneBit) {
        return InvalidArgument("unknown Compression");
      }
      if (in.dtype != DType::kF32) {
        return InvalidArgument("compression applies to f32 tensors only; got " +
                               std::string(dtypeName(in.dtype)));
      }
      if (o.compressionBlock == 0 || o.compressionBlock > compress::kMaxBlock) {
        return InvalidArgument("compressionBlock must be in [1, " +
                               std::to_string(compress::kMaxBlock) + "]");
      }
    }
    return OkStatus();
  }

  // Finishes `op` and returns true when it must not start: the client already failed (sticky
  // error), it has no chunks (OK at once), or a chunk of (key, iteration) is still in flight
  // (chunks sent anyway would stay behind, pointing into memory the failed handle hands back).
  bool finishedBeforeStartLocked(detail::OpState& op, uint64_t key, uint64_t iteration,
                                 uint32_t chunkCount) {
    if (!sticky_.ok()) {
      op.finish(sticky_);
      noteUnwaitedLocked(op);
      return true;
    }
    if (closed_) {  // close() runs (its goodbyes, the joins) before it sets sticky_
      op.finish(Cancelled("push-pull client closed"));
      noteUnwaitedLocked(op);
      return true;
    }
    if (chunkCount == 0) {
      op.finish(OkStatus());
      return true;
    }
    // Any op of this (key, iteration) not done yet, whatever its chunk count: its chunks may
    // still be pending or, after a failure, still being sent from its `in`. One pass also drops
    // the ops that are done (ops_ holds the unfinished ones, for this check and for close()).
    bool inFlight = false;
    std::erase_if(ops_, [&](const std::shared_ptr<detail::OpState>& other) {
      std::lock_guard<std::mutex> l(other->mu);
      if (other->done) {
        if (!other->status.ok() && !other->reported) {
          other->reported = true;
          if (unreported_.ok()) unreported_ = other->status;
        }
        return true;
      }
      inFlight = inFlight || (other->key == key && other->iteration == iteration);
      return false;
    });
    if (!inFlight) return false;
    op.finish(FailedPrecondition("pushPull key=" + std::to_string(key) +
                                 " iteration=" + std::to_string(iteration) +
                                 " is already in flight on this client"));
    noteUnwaitedLocked(op);
    return true;
  }

  // The encoding of each chunk of `in`; 1-bit keeps a per-key residual (error feedback), which
  // moves here: call it only for an op that passed its refusal checks, holding feedbackMu_.
  std::vector<std::shared_ptr<std::vector<uint8_t>>> compressChunks(
      uint64_t key, TensorView in, const ChunkLayout& layout, const PushPullOptions& o,
      const std::unique_lock<std::mutex>& feedbackLock) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> out(layout.chunkCount);
    float* residual = nullptr;
    if (o.compression == Compression::kOneBit) {
      COFAB_CHECK(feedbackLock.mutex() == &feedbackMu_ && feedbackLock.owns_lock())
          << "compressChunks: 1-bit error feedback without feedbackMu_";
      residual = feedback_.residual(key, in.count);
    }
    for (uint32_t c = 0; c < layout.chunkCount; ++c) {
      const size_t first = static_cast<size_t>(c) * layout.elementsPerChunk;
      const size_t n = std::min(layout.elementsPerChunk, in.count - first);
      out[c] = std::make_shared<std::vector<uint8_t>>(
          compress::compressedBytes(o.compression, n, o.compressionBlock));
      compress::compress(o.compression, in.as<const float>() + first, n, o.compressionBlock,
                         residual ? residual + first : nullptr, out[c]->data());
    }
    return out;
  }

  void sendChunkLocked(const ChunkId& id, Pending& p) {
    ServerState& s = servers_[static_cast<size_t>(p.server)];
    if (s.outstanding++ == 0) s.lastHeardNs = nowNs();
    if (s.creditWindow > 0 && p.push) {  // a bare PULL carries no payload to credit
      // FIFO behind earlier waiters; one chunk may always go when nothing is outstanding.
      if (!s.creditQueue.empty() || (s.creditUsed > 0 && s.creditUsed + p.bytes > s.creditWindow)) {
        s.creditQueue.push_back(id);
        creditStalls_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      s.creditUsed += p.bytes;
      p.creditHeld = true;
    }
    transmitLocked(id, p);
  }

  // Returns the credit `p` holds and sends what now fits from its daemon's queue.
  void releaseCreditLocked(Pending& p, bool drain = true) {
    if (!p.creditHeld) return;
    p.creditHeld = false;
    ServerState& s = servers_[static_cast<size_t>(p.server)];
    s.creditUsed -= std::min<uint64_t>(s.creditUsed, p.bytes);
    if (drain) drainCreditLocked(s);
  }

  void drainCreditLocked(ServerState& s) {
    while (!s.creditQueue.empty()) {
      auto it = pending_.find(s.creditQueue.front());
      if (it == pending_.end()) {  // failed meanwhile
        s.creditQueue.pop_front();
        continue;
      }
      Pending& q = it->second;
      if (s.creditWindow > 0 && s.creditUsed > 0 && s.creditUsed + q.bytes > s.creditWindow) {
        return;
      }
      s.creditQueue.pop_front();
      s.creditUsed += q.bytes;
      q.creditHeld = s.creditWindow > 0;
      transmitLocked(it->first, q);
    }
  }

  void transmitLocked(const ChunkId& id, Pending& p) {
    ServerState& s = servers_[static_cast<size_t>(p.server)];
    wire::Header h;
    h.type = wire::MessageType::kPush;
    h.senderRank = static_cast<uint32_t>(rank_);
    h.key = id.key;
    h.iteration = id.iteration;
    h.chunkIndex = id.chunk;
    h.chunkCount = p.chunkCount;
    h.dtype = p.dtype;
    h.opcode = p.pushBits;
    h.sequence = sequence_++;
    const int server = p.server;
    auto conn = s.conn;
    auto onSent = [this, server, conn](const Status& st) {
      if (!st.ok()) onServerError(server, conn, st);
    };
    if (p.push) {
      // The send reads `in` (or the chunk's encoding) until its callback: the op stays open
      // that long, and the encoding stays alive even if the chunk's entry goes first.
      p.op->beginIo(server);
      conn->send(h, p.in, p.bytes,
                 [onSent, server, op = p.op, keep = p.encoded](const Status& st) {
                   onSent(st);
                   op->endIo(server);
                 });
      chunksPushed_.fetch_add(1, std::memory_order_relaxed);
      bytesOut_.fetch_add(p.bytes, std::memory_order_relaxed);
    }
    if (p.pull) {
      wire::Header q = h;
      q.type = wire::MessageType::kPull;
      q.opcode = 0;
      q.sequence = sequence_++;
      conn->send(q, nullptr, 0, onSent);
    }
  }

  void postRecv(int server, std::shared_ptr<transport::Connection> conn) {
    conn->recvRouted([this, server](const wire::Header& h) { return routeResult(server, h); },
                     [this, server, conn](const Status& st, const wire::Header& h,
                                          std::vector<uint8_t>&& payload) {
                       std::shared_ptr<detail::OpState> routed;
                       {
                         std::lock_guard<std::mutex> lock(mu_);
                         routed = std::move(servers_[static_cast<size_t>(server)].routedOp);
                         if (routed && !st.ok()) {
                           auto it = pending_.find(servers_[static_cast<size_t>(server)].routedId);
                           if (it != pending_.end()) it->second.writing = false;
                         }
                       }
                       if (!st.ok()) {
                         if (routed) routed->endIo(server);
                         onServerError(server, conn, st);
                         return;
                       }
                       onMessage(server, h, std::move(payload), routed);
                       postRecv(server, conn);
                     });
  }

  // The transport's route for results: straight into the pending chunk's `out`, so a result
  // costs no allocation, zero-fill or copy. Falls back to a transport buffer (copied in
  // onMessage) for anything else: control messages, compressed results, unknown or duplicate
  // chunks, and in-place chunks with replication on (their `in` may still have to be resent).
  transport::MutableSlice routeResult(int server, const wire::Header& h) {
    if (h.type != wire::MessageType::kPullReply || h.payloadLength == 0) return {};
    std::lock_guard<std::mutex> lock(mu_);
    const ChunkId id{h.key, h.iteration, h.chunkIndex};
    auto it = pending_.find(id);
    if (it == pending_.end()) return {};
    Pending& p = it->second;
    if (p.writing || p.codec != compress::Compression::kNone || p.bytes != h.payloadLength) {
      return {};
    }
    if (replication_ && p.in < p.out + p.bytes && p.out < p.in + p.bytes) return {};
    p.writing = true;
    ServerState& s = servers_[static_cast<size_t>(server)];
    s.routedOp = p.op;
    s.routedId = id;
    p.op->beginIo(server);
    return {p.out, p.bytes, nullptr};
  }

  std::string serverName(int s) const {
    return "aggregator " + std::to_string(s) + " (" + servers_[static_cast<size_t>(s)].address +
           ")";
  }

  // `routed`: the result was received straight into that op's `out` (routeResult).
  void onMessage(int server, const wire::Header& h, std::vector<uint8_t>&& payload,
                 const std::shared_ptr<detail::OpState>& routed) {
    std::unique_lock<std::mutex> lock(mu_);
    servers_[static_cast<size_t>(server)].lastHeardNs = nowNs();
    const ChunkId id{h.key, h.iteration, h.chunkIndex};
    // The write into `out` is over: a failure that came meanwhile may complete the op now.
    if (routed) routed->endIo(server);
    if (h.type == wire::MessageType::kPullReply) {
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // a duplicate result after a resend: already applied
      Pending& p = it->second;
      const bool alreadyInOut = routed && p.writing;  // routeResult put it there
      if (!alreadyInOut && payload.size() != p.bytes) {
        failOpLocked(
            p.op, DataLoss(serverName(server) + " sent " + std::to_string(payload.size()) +
                           " bytes for " + h.describe() + ", expected " + std::to_string(p.bytes)));
        return;
      }
      if (alreadyInOut) {
        p.writing = false;
      } else if (p.codec != compress::Compression::kNone) {
        Status st = compress::decompress(p.codec, payload.data(), payload.size(), p.count,
                                         reinterpret_cast<float*>(p.out));
        if (!st.ok()) {
          failOpLocked(p.op, DataLoss(serverName(server) + " sent a bad compressed result for " +
                                      h.describe() + ": " + st.message()));
          return;
        }
      } else if (p.bytes > 0) {
        std::memcpy(p.out, payload.data(), p.bytes);
      }
      bytesIn_.fetch_add(p.bytes, std::memory_order_relaxed);
      auto op = p.op;
      const int s = p.server;
      servers_[static_cast<size_t>(s)].outstanding--;
      releaseCreditLocked(p);
      const bool ackPending = !p.ackCounted;
      pending_.erase(it);
      if (ackPending) op->chunkAcked();  // a result implies the contribution was applied
      bool complete = false;
      {
        std::lock_guard<std::mutex> l(op->mu);
        op->chunkServer[id.chunk] = -1;
        complete = --op->remaining == 0;
      }
      if (complete) op->finish(OkStatus());
      return;
    }
    if (h.type != wire::MessageType::kControl) return;
    // A control message from a daemon already marked dead (read before onServerError closed its
    // connection): its chunks belong to the backup now, whose credit window and answers count;
    // an ack or reject from the dead one would release the backup's credit or fail an op the
    // backup is serving. (A result from it, above, is still right: a round completes only once
    // the backup holds every contribution.)
    if (servers_[static_cast<size_t>(server)].dead) return;
    const auto cop = static_cast<ControlOp>(h.opcode);
    if (cop == ControlOp::kAck) {
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      Pending& p = it->second;
      p.acked = true;
      releaseCreditLocked(p);
      if (!p.ackCounted) {
        p.ackCounted = true;
        p.op->chunkAcked();
      }
      return;
    }
    if (cop == ControlOp::kCredit) {
      ServerState& s = servers_[static_cast<size_t>(server)];
      uint64_t window = 0;
      for (size_t i = 0; i < 8 && i < payload.size(); ++i) {
        window |= static_cast<uint64_t>(payload[i]) << (8 * i);
      }
      s.granted = true;
      s.creditWindow = window;
      stopCv_.notify_all();
      drainCreditLocked(s);
      return;
    }
    if (cop == ControlOp::kReject) {
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      const Reject rej = parseReject(payload);
      const bool precondition = rej.reason == RejectReason::kFinishedIteration ||
                                rej.reason == RejectReason::kBeyondWindow ||
                                rej.reason == RejectReason::kDraining;
      std::string msg = serverName(server) + " rejected " + h.describe() + ": " + rej.describe();
      failOpLocked(it->second.op, precondition ? FailedPrecondition(msg) : InvalidArgument(msg));
      return;
    }
    if (cop == ControlOp::kRoundFailed) {
      std::string text(payload.begin(), payload.end());
      failAllLocked(Aborted(serverName(server) + " released the round without a result: " + text));
      return;
    }
  }

  void onServerError(int server, const std::shared_ptr<transport::Connection>& conn,
                     const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    ServerState& s = servers_[static_cast<size_t>(server)];
    if (closed_ || s.dead || s.conn != conn) return;
    s.dead = true;
    deadNow_[static_cast<size_t>(server)].store(true);
    stopCv_.notify_all();  // connect()'s wait for the credit grants stops waiting for it
    s.conn->close();
    const int m = static_cast<int>(servers_.size());
    const int backup = backupServer(server, m);
    // This daemon is the backup of its predecessor's chunks: with the predecessor gone too,
    // those chunks (failed over here) have no copy left anywhere.
    const int predecessor = (server + m - 1) % m;
    if (!replication_ || m < 2 || servers_[static_cast<size_t>(backup)].dead ||
        servers_[static_cast<size_t>(predecessor)].dead) {
      std::string why = "; no backup (replication off)";
      if (replication_ && m >= 2) {
        const int other = servers_[static_cast<size_t>(backup)].dead ? backup : predecessor;
        why = "; " + serverName(other) + ", the other daemon of its replica pair, is gone too";
      }
      failAllLocked(Unavailable(serverName(server) + " failed: " + st.toString() + why));
      return;
    }
    COFAB_LOG(kWarn, "ps") << serverName(server) << " failed (" << st.toString()
                           << "); failing over to " << serverName(backup);
    failovers_.fetch_add(1);
    // Resend everything that has no result yet: the backup applies what it has not seen and
    // answers duplicates (forwarded before the primary died) without applying them twice.
    std::vector<ChunkId> moved;
    for (auto& [id, p] : pending_) {
      if (p.server == server) moved.push_back(id);
    }
    std::sort(moved.begin(), moved.end(), [](const ChunkId& a, const ChunkId& b) {
      return std::tie(a.iteration, a.key, a.chunk) < std::tie(b.iteration, b.key, b.chunk);
    });
    s.outstanding = 0;
    s.creditUsed = 0;
    s.creditQueue.clear();
    for (const ChunkId& id : moved) {
      Pending& p = pending_[id];
      p.server = backup;
      p.acked = false;
      p.creditHeld = false;
      {
        std::lock_guard<std::mutex> l(p.op->mu);
        p.op->chunkServer[id.chunk] = backup;
      }
      chunksResent_.fetch_add(1);
      sendChunkLocked(id, p);
    }
  }

  // `op` by value: callers pass the op of a pending entry, and the loop below erases those.
  void failOpLocked(std::shared_ptr<detail::OpState> op, const Status& st) {
    if (!op->finish(st)) return;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.op == op) {
        servers_[static_cast<size_t>(it->second.server)].outstanding--;
        releaseCreditLocked(it->second, /*drain=*/false);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : servers_) {
      // Its chunks still waiting for credit leave the queue now. Left there, an entry would
      // send whatever later takes the same (key, iteration, chunk): the op pushed again sent
      // each chunk twice and leaked the second one's credit.
      std::erase_if(s.creditQueue,
                    [&](const ChunkId& id) { return pending_.find(id) == pending_.end(); });
      drainCreditLocked(s);
    }
  }

  void failAllLocked(const Status& st) {
    if (sticky_.ok()) sticky_ = st;
    stopCv_.notify_all();  // connect()'s wait for the credit grants ends with it
    for (auto& [id, p] : pending_) p.op->finish(sticky_);
    pending_.clear();
    for (auto& s : servers_) {
      s.outstanding = 0;
      s.creditUsed = 0;
      s.creditQueue.clear();
    }
  }

  void heartbeatLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    const auto period = Millis(std::max<int64_t>(1, heartbeatMs_ / 2));
    while (!stop_) {
      stopCv_.wait_for(lock, period);
      if (stop_) break;
      const int64_t now = nowNs();
      for (size_t i = 0; i < servers_.size(); ++i) {
        ServerState& s = servers_[i];
        if (s.dead || s.outstanding == 0) continue;
        const int64_t silentMs = (now - s.lastHeardNs) / 1000000;
        if (replication_ && silentMs >= failoverMs_) {
          auto conn = s.conn;
          lock.unlock();
          onServerError(static_cast<int>(i), conn,
                        DeadlineExceeded("silent for " + std::to_string(silentMs) +
                                         " ms with chunks outstanding (heartbeat)"));
          lock.lock();
          continue;
        }
        if (silentMs >= heartbeatMs_ && (now - s.lastPingNs) / 1000000 >= heartbeatMs_) {
          s.lastPingNs = now;
          wire::Header h;
          h.type = wire::MessageType::kControl;
          h.opcode = static_cast<uint8_t>(ControlOp::kPing);
          h.senderRank = static_cast<uint32_t>(rank_);
          s.conn->send(h, nullptr, 0, [](const Status&) {});
        }
      }
    }
  }

  mutable std::mutex mu_;
  std::condition_variable stopCv_;
  bool stop_ = false;
  bool closed_ = false;
  Status sticky_;
  uint64_t sequence_ = 0;
  std::shared_ptr<transport::Context> ctx_;
  std::unordered_map<ChunkId, Pending, ChunkIdHash> pending_;
  // A leaf lock (nothing is called while it is held), so reserveIteration() may be called under
  // the caller's own locks, which completion callbacks also take.
  std::mutex iterationMu_;
  std::unordered_map<uint64_t, uint64_t> nextIteration_;  // guarded by iterationMu_
  std::mutex feedbackMu_;             // guards feedback_ (taken before, never inside, mu_)
  compress::ErrorFeedback feedback_;  // per key, 1-bit compression
  std::vector<std::shared_ptr<detail::OpState>> ops_;
  // The first failure of an op no longer in ops_ (dropped when done, or refused at the start)
  // that no waitAll() has returned yet.
  Status unreported_;
  std::thread heartbeat_;
};

namespace {

StatusOr<std::unique_ptr<PushPullClient::Impl>> makeImpl(int rank, int worldSize,
                                                         ClientOptions options) {
  if (worldSize <= 0 || rank < 0 || rank >= worldSize) {
    return InvalidArgument("PushPullClient: rank " + std::to_string(rank) +
                           " outside a world of size " + std::to_string(worldSize));
  }
  if (options.transport.empty()) {
    COFAB_ASSIGN_OR_RETURN(options.transport, kPsTransport.get());
  }
  auto impl = std::make_unique<PushPullClient::Impl>(rank, worldSize, options);
  if (options.chunkBytes == 0) {
    COFAB_ASSIGN_OR_RETURN(int64_t v, kPsChunkBytes.get());
    impl->chunkBytes_ = static_cast<size_t>(v);
  } else if (options.chunkBytes > wire::kDefaultMaxPayload) {
    // Refused here, not by the first large push's send, which would look like a lost daemon.
    return InvalidArgument("PushPullClient: ClientOptions::chunkBytes=" +
                           std::to_string(options.chunkBytes) + " exceeds a message's " +
                           std::to_string(wire::kDefaultMaxPayload) + " bytes");
  } else {
    impl->chunkBytes_ = options.chunkBytes;
  }
  if (options.replication < 0) {
    COFAB_ASSIGN_OR_RETURN(impl->replication_, kPsReplication.get());
  } else {
    impl->replication_ = options.replication != 0;
  }
  if (options.credits < 0) {
    COFAB_ASSIGN_OR_RETURN(impl->credits_, kPsCredits.get());
  } else {
    impl->credits_ = options.credits != 0;
  }
  if (options.heartbeatMs > 0) {
    impl->heartbeatMs_ = options.heartbeatMs;
  } else {
    COFAB_ASSIGN_OR_RETURN(impl->heartbeatMs_, kPsHeartbeatMs.get());
  }
  if (options.failoverMs > 0) {
    impl->failoverMs_ = options.failoverMs;
  } else {
    COFAB_ASSIGN_OR_RETURN(impl->failoverMs_, kPsFailoverMs.get());
  }
  // A ping goes out after heartbeatMs of silence (checked every heartbeatMs / 2): a shorter
  // failover deadline fails a live primary over before it could answer one.
  if (impl->replication_ && impl->failoverMs_ < 2 * impl->heartbeatMs_) {
    return InvalidArgument("PushPullClient: failoverMs (COFAB_PS_FAILOVER_MS) is " +
                           std::to_string(impl->failoverMs_) +
                           " ms, below twice heartbeatMs (COFAB_PS_HEARTBEAT_MS), " +
                           std::to_string(impl->heartbeatMs_) + " ms");
  }
  return impl;
}

// Validates the options, then finds the daemons (listed, or through `store`) and connects.
StatusOr<std::unique_ptr<PushPullClient::Impl>> startImpl(Store* store, int rank, int worldSize,
                                                          const ClientOptions& options) {
  COFAB_ASSIGN_OR_RETURN(auto impl, makeImpl(rank, worldSize, options));
  // One deadline for all of connect: finding the daemons, checking their chunk limit, dialling
  // them and their credit grants (each step used to get connectTimeoutMs of its own).
  const Deadline deadline = Deadline::afterMs(options.connectTimeoutMs);
  COFAB_ASSIGN_OR_RETURN(
      std::vector<std::string> addresses,
      findDaemons(store, options.storePrefix, options.serverAddresses, impl->chunkBytes_, deadline,
                  "PushPullClient::connect", "ClientOptions::chunkBytes / COFAB_PS_CHUNK_BYTES"));
  COFAB_RETURN_IF_ERROR(impl->start(addresses, deadline));
  return impl;
}

}  // namespace

StatusOr<std::unique_ptr<PushPullClient>> PushPullClient::connect(Store& store, int rank,
                                                                  int worldSize,
                                                                  const ClientOptions& options) {
  COFAB_ASSIGN_OR_RETURN(auto impl, startImpl(&store, rank, worldSize, options));
  return std::unique_ptr<PushPullClient>(new PushPullClient(std::move(impl)));
}

StatusOr<std::unique_ptr<PushPullClient>> PushPullClient::connect(int rank, int worldSize,
                                                                  const ClientOptions& options) {
  COFAB_ASSIGN_OR_RETURN(auto impl, startImpl(nullptr, rank, worldSize, options));
  return std::unique_ptr<PushPullClient>(new PushPullClient(std::move(impl)));
}

PushPullClient::PushPullClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PushPullClient::~PushPullClient() { close(); }

PushPullHandle PushPullClient::pushPull(uint64_t key, TensorView in, TensorView out,
                                        const PushPullOptions& options) {
  return impl_->pushPull(key, in, out, options);
}
Status PushPullClient::waitAll(Deadline deadline) { return impl_->waitAll(deadline); }
Status PushPullClient::status() const { return impl_->status(); }
void PushPullClient::close() { impl_->close(); }
int PushPullClient::rank() const { return impl_->rank_; }
int PushPullClient::worldSize() const { return impl_->worldSize_; }
int PushPullClient::numServers() const { return static_cast<int>(impl_->servers_.size()); }
int PushPullClient::currentServer(uint64_t key, uint32_t chunk) const {
  return impl_->currentServer(key, chunk);
}
uint64_t PushPullClient::reserveIteration(uint64_t key) { return impl_->reserveIteration(key); }
size_t PushPullClient::chunkBytes() const { return impl_->chunkBytes_; }
ClientStats PushPullClient::stats() const {
  ClientStats s;
  s.chunksPushed = impl_->chunksPushed_.load();
  s.chunksResent = impl_->chunksResent_.load();
  s.bytesOut = impl_->bytesOut_.load();
  s.bytesIn = impl_->bytesIn_.load();
  s.failovers = impl_->failovers_.load();
  s.creditStalls = impl_->creditStalls_.load();
  return s;
}

Status waitEveryHandle(PushPullClient& client, std::span<const PushPullHandle> handles,
                       Deadline deadline, size_t* failedIndex) {
  Status first;
  size_t firstIndex = 0;
  bool running = false;
  for (size_t i = 0; i < handles.size(); ++i) {
    Status st = handles[i].wait(deadline);
    if (!handles[i].test()) running = true;
    if (!st.ok() && first.ok()) {
      first = st;
      firstIndex = i;
    }
  }
  if (running) {
    // close() joins the transport's threads, then fails what is pending with Cancelled: from
    // here on nothing touches the buffers, and every handle completes at once.
    // Another thread may be inside close() already (its close() returned at once here): its
    // goodbyes (1 s at most) and joins finish the handles, so the wait is long before the
    // check calls a handle that still runs a broken invariant.
    client.close();
    for (const PushPullHandle& h : handles) {
      h.wait(Deadline::afterMs(120000)).ignoreError();
      COFAB_CHECK(h.test()) << "a push-pull still running after its client was closed";
    }
  }
  if (failedIndex != nullptr) *failedIndex = firstIndex;
  return first;
}

}  // namespace cofab::ps
