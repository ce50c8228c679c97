#include "fabric/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/log.h"
#include "core/param.h"
#include "fabric/comm/collective_op.h"
#include "fabric/comm/collectives.h"
#include "fabric/transport/registry.h"

namespace cofab::comm {

COFAB_PARAM_INT(kSetupTimeoutMs, "COFAB_COMM_SETUP_TIMEOUT_MS", 60000, 1, 86400000,
                "bound on communicator setup (store rendezvous and connections), ms");
COFAB_PARAM_INT(kDiagGraceMs, "COFAB_COMM_DIAG_GRACE_MS", 1000, 0, 600000,
                "how long a timed-out collective waits for the other ranks' reports before "
                "naming the ranks that did not arrive, ms");

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

std::string addrKey(int rank) { return "addr/" + std::to_string(rank); }
// The ranks whose connections are all up (agreeOutcome()).
constexpr char kUpKey[] = "up";
// A generation's one outcome, "ok" or "failed": the first rank to decide sets it.
constexpr char kOutcomeKey[] = "outcome";

// A listen address on the same host with a kernel-chosen port: "h:p" -> "h:0" (also "[v6]:p"),
// anything without a numeric port as it is. A sub-communicator listens where its parent does,
// which a fixed port would collide with; before, it listened on the transport's default
// (loopback for tcp), so remote ranks could not reach it.
std::string anyPortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return address;
  if (address.find(':') != colon && address.front() != '[') return address;  // bare IPv6
  for (size_t i = colon + 1; i < address.size(); ++i) {
    if (address[i] < '0' || address[i] > '9') return address;
  }
  return address.substr(0, colon) + ":0";
}

std::string peerIdFor(const std::string& prefix, int rank) {
  return prefix + " rank " + std::to_string(rank);
}

// Parses "<prefix> rank <n>"; -1 if the id belongs to another communicator.
int parsePeerRank(const std::string& prefix, const std::string& id) {
  const std::string head = prefix + " rank ";
  if (id.compare(0, head.size(), head) != 0) return -1;
  char* end = nullptr;
  const long v = std::strtol(id.c_str() + head.size(), &end, 10);
  if (end == id.c_str() + head.size() || *end != '\0' || v < 0 || v > INT32_MAX) return -1;
  return static_cast<int>(v);
}

Duration orParam(Duration d, const IntParam& param) {
  if (d > Duration::zero()) return d;
  auto ms = param.get();
  return Millis(ms.ok() ? *ms : param.defaultValue());
}

}  // namespace

Communicator::Communicator(int rank, int size, Store* store, std::string name, std::string prefix,
                           std::shared_ptr<transport::Context> context)
    : rank_(rank),
      size_(size),
      baseStore_(store),
      name_(std::move(name)),
      prefix_(std::move(prefix)),
      store_(prefix_, store),
      context_(std::move(context)),
      conns_(static_cast<size_t>(size)),
      arrived_(new std::atomic<uint64_t>[static_cast<size_t>(size)]),
      p2pSendSeq_(static_cast<size_t>(size), 0),
      p2pRecvSeq_(static_cast<size_t>(size), 0) {
  for (int i = 0; i < size; ++i) arrived_[static_cast<size_t>(i)].store(0);
}

StatusOr<std::unique_ptr<Communicator>> Communicator::create(int rank, int size, Store* store,
                                                             const CommOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("communicator: rank " + std::to_string(rank) + " of size " +
                           std::to_string(size) + " is out of range");
  }
  transport::ContextOptions copts;
  copts.localId = options.name + " rank " + std::to_string(rank);
  std::shared_ptr<transport::Context> context;
  if (size > 1) {
    COFAB_ASSIGN_OR_RETURN(context, transport::Registry::create(options.transport, copts));
  }
  return create(rank, size, store, std::move(context), options);
}

StatusOr<std::unique_ptr<Communicator>> Communicator::create(
    int rank, int size, Store* store, std::shared_ptr<transport::Context> context,
    const CommOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("communicator: rank " + std::to_string(rank) + " of size " +
                           std::to_string(size) + " is out of range");
  }
  if (store == nullptr) return InvalidArgument("communicator: store is null");
  if (size > 1 && context == nullptr) return InvalidArgument("communicator: context is null");
  const Deadline deadline = Deadline::after(orParam(options.setupTimeout, kSetupTimeoutMs));
  // Every re-creation under one name gets a fresh namespace (a generation), so addresses left
  // by an earlier communicator of the same name are never read. A generation ends with one
  // outcome its ranks agree on (agreeOutcome(): "ok" or "failed", the first to decide wins), and
  // a setup takes the first generation of its name with no outcome yet. So a rank that timed out
  // alone (it started before the others) and the ranks that come later meet in one generation,
  // and a setup that failed on some ranks only moves all of them on together. The per-rank key
  // remembers where this rank's scan starts.
  const std::string seenKey = options.name + "/generation/" + std::to_string(rank);
  int64_t generation = 0;
  COFAB_ASSIGN_OR_RETURN(bool hinted, store->check({seenKey}));
  if (hinted) {
    COFAB_ASSIGN_OR_RETURN(Bytes seen, store->get(seenKey, deadline));
    COFAB_ASSIGN_OR_RETURN(generation, parseCounter(seenKey, seen));
  }
  while (true) {
    ++generation;
    COFAB_ASSIGN_OR_RETURN(bool decided, store->check({options.name + "/" +
                                                       std::to_string(generation) + "/" +
                                                       kOutcomeKey}));
    if (!decided) break;
  }
  std::string prefix = options.name + "/" + std::to_string(generation);
  std::unique_ptr<Communicator> comm(
      new Communicator(rank, size, store, options.name, prefix, std::move(context)));
  comm->allreducePath_ = options.allreducePath;
  comm->listenAddress_ = options.listenAddress;
  const Status connected = comm->connectMesh(options, deadline);
  // The ranks still connecting may need up to their own setup timeout after this rank's.
  const Deadline confirm =
      Deadline::after(deadline.remaining() + orParam(options.setupTimeout, kSetupTimeoutMs));
  const Status agreed = comm->agreeOutcome(connected, confirm);
  // Only where the next scan starts: a failure to write it costs a longer scan, nothing more.
  store->set(seenKey, toBytes(std::to_string(generation))).ignoreError();
  if (!agreed.ok()) {
    return agreed.withContext("communicator '" + options.name + "' rank " +
                              std::to_string(rank) + " of " + std::to_string(size));
  }
  return comm;
}

Status Communicator::agreeOutcome(const Status& connected, Deadline deadline) {
  // A rank whose connections are all up counts itself in; the one that completes the count
  // decides "ok". A rank that failed decides "failed". Whichever comes first is the outcome
  // every rank follows, and all of them wait on that one key, so a "failed" reaches ranks
  // already done at once. A rank that sees no outcome by `deadline` decides "failed" itself.
  std::string decide = "failed";
  Status counted = connected;
  if (connected.ok()) {
    StatusOr<int64_t> up = store_.add(kUpKey, 1);
    counted = up.status();
    if (up.ok() && *up == size_) decide = "ok";
  }
  // Who won does not matter here: the wait below reads the outcome, whoever set it (also when
  // this compare-and-set's reply was lost).
  if (!counted.ok() || decide == "ok") {
    store_.compareSet(kOutcomeKey, {}, toBytes(decide)).status().ignoreError();
  }
  Status waited = store_.wait({kOutcomeKey}, deadline);
  if (!waited.ok()) store_.compareSet(kOutcomeKey, {}, toBytes("failed")).status().ignoreError();
  StatusOr<Bytes> outcome = store_.get(kOutcomeKey, Deadline::afterMs(2000));
  if (!outcome.ok()) {
    return outcome.status().withContext("setup: reading the attempt's outcome from the store");
  }
  if (!connected.ok()) return connected;
  // "ok" means every rank was counted, this one too (an add whose reply was lost was applied).
  if (toString(*outcome) == "ok") return OkStatus();
  if (!counted.ok()) return counted.withContext("setup: counting this rank in");
  if (!waited.ok()) {
    return DeadlineExceeded(
        "setup: this rank's connections were up, but not every rank's by the deadline (a rank "
        "that is slow or gone); every rank gives this attempt up: retry on every rank");
  }
  return Aborted("setup: another rank's setup failed, and every rank gives this attempt up with "
                 "it: retry on every rank");
}

Status Communicator::connectMesh(const CommOptions& options, Deadline deadline) {
  const std::string sizeText = std::to_string(size_);
  COFAB_ASSIGN_OR_RETURN(Bytes agreed, store_.compareSet("size", {}, toBytes(sizeText)));
  if (toString(agreed) != sizeText) {
    return InvalidArgument("ranks disagree on the communicator size: this rank says " + sizeText +
                           ", another said " + toString(agreed));
  }
  if (size_ == 1) return OkStatus();

  COFAB_ASSIGN_OR_RETURN(auto listener, context_->listen({options.listenAddress}));
  COFAB_RETURN_IF_ERROR(store_.set(addrKey(rank_), toBytes(listener->address())));

  // Waits in slices of at most 1 s, between which it looks whether another rank has already
  // given this generation up (an outcome is set): joining as that happens must not wait out
  // the whole deadline in a generation nobody else is in any more.
  auto givenUp = [&]() -> Status {
    if (deadline.expired()) return OkStatus();  // this rank's own timeout says more
    auto decided = store_.check({kOutcomeKey});
    if (decided.ok() && *decided) {
      return Aborted("setup: another rank gave this attempt up (its setup failed) while this one "
                     "was joining: retry on every rank");
    }
    return OkStatus();
  };
  // Lower ranks are dialled, higher ranks dial us: one connection per pair, no races.
  std::vector<std::string> keys;
  for (int p = 0; p < rank_; ++p) keys.push_back(addrKey(p));
  Status published = keys.empty() ? OkStatus() : DeadlineExceeded("not yet");
  while (!published.ok() && !deadline.expired()) {
    const Deadline slice = deadline.min(Deadline::afterMs(1000));
    published = store_.wait(keys, slice);
    if (published.code() != StatusCode::kDeadlineExceeded) break;  // there, or the store failed
    COFAB_RETURN_IF_ERROR(givenUp());
  }
  if (!published.ok()) {
    std::vector<int> missing;
    for (int p = 0; p < rank_; ++p) {
      auto there = store_.check({addrKey(p)});
      if (!there.ok() || !*there) missing.push_back(p);
    }
    if (!missing.empty()) {
      return DeadlineExceeded("setup timed out: rank(s) " + rankList(missing) +
                              " never published their address in " + store_.describe() +
                              " (did they start, with the same store and communicator name?)");
    }
  }
  for (int p = 0; p < rank_; ++p) {
    transport::ConnectOptions co;
    co.localId = peerIdFor(prefix_, rank_);
    while (true) {
      // In slices too, reading the address again each time: a listener that is gone (rank p
      // gave up, or left the address behind when it was killed) is retried only while the
      // attempt is still on, and a new address published meanwhile is used.
      COFAB_ASSIGN_OR_RETURN(Bytes addr, store_.get(addrKey(p), deadline));
      auto conn = context_->connect(toString(addr), co, deadline.min(Deadline::afterMs(2000)));
      if (conn.ok()) {
        conns_[static_cast<size_t>(p)] = std::move(conn).value();
        break;
      }
      const StatusCode code = conn.status().code();
      if (deadline.expired() ||
          (code != StatusCode::kDeadlineExceeded && code != StatusCode::kUnavailable)) {
        return Status(code, "connecting to rank " + std::to_string(p) + " at " + toString(addr) +
                                ": " + conn.status().message());
      }
      COFAB_RETURN_IF_ERROR(givenUp());
    }
  }
  for (int accepted = 0; accepted < size_ - 1 - rank_;) {
    const Deadline slice = deadline.min(Deadline::afterMs(1000));
    auto conn = listener->accept(slice);
    if (!conn.ok() && conn.status().code() == StatusCode::kDeadlineExceeded &&
        !deadline.expired()) {
      COFAB_RETURN_IF_ERROR(givenUp());
      continue;
    }
    if (!conn.ok()) {
      std::vector<int> missing;
      for (int p = rank_ + 1; p < size_; ++p) {
        if (!conns_[static_cast<size_t>(p)]) missing.push_back(p);
      }
      return Status(conn.status().code() == StatusCode::kDeadlineExceeded
                        ? StatusCode::kDeadlineExceeded
                        : conn.status().code(),
                    "setup: rank(s) " + rankList(missing) + " did not connect (" +
                        conn.status().message() + ")");
    }
    const int p = parsePeerRank(prefix_, (*conn)->peerId());
    if (p <= rank_ || p >= size_) {
      COFAB_LOG(kWarn, "comm") << "communicator '" << name_ << "': dropping unexpected connection"
                               << " from '" << (*conn)->peerId() << "'";
      (*conn)->close();
      continue;
    }
    auto& slot = conns_[static_cast<size_t>(p)];
    if (slot) {
      // Rank p dials again only once it gave up an earlier attempt (its handshake's time slice
      // ran out after this side had taken it): the newest connection is the live one.
      slot->close();
    } else {
      ++accepted;
    }
    slot = std::move(conn).value();
  }
  listener->close();
  return OkStatus();
}

Communicator::~Communicator() {
  // An op that completed may still be in running_ or posted_: completion wakes its waiter
  // before the op leaves the communicator (opFinished), and a caller that returned from a
  // blocking call and destroyed the communicator at once is not leaving operations pending.
  bool busy = false;
  std::vector<std::shared_ptr<CollectiveOp>> started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy = !queue_.empty();
    if (running_) started.push_back(running_);
    for (const auto& [raw, op] : posted_) started.push_back(op);
  }
  for (const auto& op : started) busy = busy || !op->done();  // op locks outside mu_
  started.clear();
  // An allreduce on the path still running reads `in` and writes `out` after we are gone:
  // failing the communicator cancels it (handleFailure), and the join below waits for that.
  for (const auto& op : livePathOps()) busy = busy || !op->test();
  if (busy) reportFailure(nullptr, Aborted("communicator '" + name_ + "' destroyed while "
                                           "operations were pending"), -1);
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return idle(); });
  }
  if (failThread_.joinable()) failThread_.join();
  // Every op is done now (the failure procedure completes the queued ones after idle() already
  // holds, so only after its join), and no new OpCall can be taken; a waiter may still be
  // inside pendingDeadline() and the like with one taken before.
  while (opCalls_.load() != 0) std::this_thread::yield();
  for (auto& c : conns_) {
    if (c) c->close();
  }
  conns_.clear();
  if (context_ && context_.use_count() == 1) context_->join();
}

StatusOr<std::unique_ptr<Communicator>> Communicator::split(int color, int key, Duration timeout) {
  int64_t mine[2] = {color, key};
  std::vector<int64_t> all(static_cast<size_t>(2 * size_));
  CollectiveOptions opts;
  opts.timeout = timeout;
  COFAB_RETURN_IF_ERROR(allgather(*this, TensorView(mine, 2, DType::kI64),
                                  TensorView(all.data(), all.size(), DType::kI64), opts)
                            .withContext("split"));
  const uint64_t splitIndex = splits_++;
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < size_; ++r) {
    if (all[static_cast<size_t>(2 * r)] == color) {
      members.emplace_back(all[static_cast<size_t>(2 * r + 1)], r);
    }
  }
  std::sort(members.begin(), members.end());
  int newRank = 0;
  while (members[static_cast<size_t>(newRank)].second != rank_) ++newRank;
  CommOptions options;
  options.name = prefix_ + "/split" + std::to_string(splitIndex) + "/color" + std::to_string(color);
  options.setupTimeout = timeout;
  options.listenAddress = anyPortOf(listenAddress_);
  const int newSize = static_cast<int>(members.size());
  return create(newRank, newSize, baseStore_, newSize > 1 ? context_ : nullptr, options);
}

Status Communicator::asyncError() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failing_ && error_.ok() ? failingWith_ : error_;
}

void Communicator::abort() {
  reportFailure(nullptr, Aborted("communicator '" + name_ + "' rank " + std::to_string(rank_) +
                                 " was aborted by the application"),
                -1);
}

StatusOr<uint8_t*> Communicator::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    const size_t rounded = bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) & ~size_t{63};
    void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      // An error of the operation (and so of the communicator, as any failed operation is), not
      // the end of the process.
      return ResourceExhausted("communicator '" + name_ + "' rank " + std::to_string(rank_) +
                               ": cannot allocate " + std::to_string(bytes) +
                               " bytes of scratch for the operation");
    }
    scratch_ = std::unique_ptr<uint8_t, void (*)(void*)>(static_cast<uint8_t*>(p), &std::free);
    scratchBytes_ = rounded;
  }
  return scratch_.get();
}

uint64_t Communicator::takeSequence(const OpSignature& sig) {
  if (sig.code != OpCode::kSendRecv) return sequence_++;
  // Point-to-point: numbered per peer and direction; `root` is the receiver (collectives.cc).
  const bool sending = sig.root == static_cast<uint32_t>(sig.peer);
  auto& v = sending ? p2pSendSeq_ : p2pRecvSeq_;
  return v[static_cast<size_t>(sig.peer)]++;
}

void Communicator::submit(const std::shared_ptr<CollectiveOp>& op) {
  std::unique_lock<std::mutex> lock(mu_);
  op->setSequence(takeSequence(op->signature()));
  if (!error_.ok()) {
    const Status error = error_;
    lock.unlock();
    op->completeUnstarted(error);
    return;
  }
  if (running_ || failing_) {
    queue_.push_back(op);
    return;
  }
  running_ = op;
  lock.unlock();
  launch(op);
}

void Communicator::launch(std::shared_ptr<CollectiveOp> op) {
  // Starting an op can post or finish it at once, which starts the next one: those run here, one
  // after the other, instead of nested in this call (a queue of many point-to-point ops would
  // otherwise recurse once per op, on whatever thread finished the op ahead of them).
  thread_local std::vector<std::shared_ptr<CollectiveOp>>* pending = nullptr;
  if (pending != nullptr) {
    pending->push_back(std::move(op));
    return;
  }
  std::vector<std::shared_ptr<CollectiveOp>> later;  // allocates only when something chains
  pending = &later;
  op->start();
  for (size_t i = 0; i < later.size(); ++i) {
    std::shared_ptr<CollectiveOp> next = std::move(later[i]);
    next->start();
  }
  pending = nullptr;
}

std::vector<std::shared_ptr<CollectiveOp>> Communicator::opsAheadOf(
    const CollectiveOp* self) const {
  std::vector<std::shared_ptr<CollectiveOp>> ahead;
  if (failing_ || !error_.ok()) return ahead;
  if (running_ && running_.get() != self) ahead.push_back(running_);
  for (const auto& [raw, op] : posted_) {
    if (raw != self) ahead.push_back(op);
  }
  const bool queued = std::any_of(queue_.begin(), queue_.end(),
                                  [self](const auto& op) { return op.get() == self; });
  for (const auto& op : queue_) {
    if (!queued || op.get() == self) break;
    ahead.push_back(op);
  }
  return ahead;
}

Deadline Communicator::pendingDeadline(const CollectiveOp* self) const {
  std::lock_guard<std::mutex> lock(mu_);
  Deadline earliest = Deadline::never();
  for (const auto& op : opsAheadOf(self)) earliest = earliest.min(op->deadline());
  return earliest;
}

void Communicator::enforcePendingDeadlines(const CollectiveOp* self) {
  std::vector<std::shared_ptr<CollectiveOp>> ahead;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ahead = opsAheadOf(self);
  }
  for (const auto& op : ahead) {
    // done() outside mu_ (an op takes the communicator's lock inside its own): one that just
    // completed may still be in running_ until opFinished, and is no timeout.
    if (op->deadline().expired() && !op->done()) {
      reportTimeout(op.get());  // re-checked there under the lock
      return;
    }
  }
}

void Communicator::notePathOp(const std::shared_ptr<PendingOp>& op) {
  Status failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(pathOps_, [](const std::weak_ptr<PendingOp>& w) { return w.expired(); });
    if (!failing_ && error_.ok()) {
      pathOps_.push_back(op);
      return;
    }
    failed = error_.ok() ? failingWith_ : error_;
  }
  op->cancel(failed);  // started after the failure: handleFailure did not see it
}

std::vector<std::shared_ptr<PendingOp>> Communicator::livePathOps() const {
  std::vector<std::shared_ptr<PendingOp>> live;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : pathOps_) {
    if (auto op = w.lock()) live.push_back(std::move(op));
  }
  return live;
}

void Communicator::opFinished(CollectiveOp* op) {
  std::shared_ptr<CollectiveOp> finished;
  std::shared_ptr<CollectiveOp> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_.get() != op) {
      // A posted point-to-point op (opPosted), or an op that never ran.
      auto it = posted_.find(op);
      if (it == posted_.end()) return;
      finished = std::move(it->second);
      posted_.erase(it);
      if (idle()) idle_.notify_all();
      return;
    }
    finished = std::move(running_);
    running_.reset();
    if (!failing_ && !queue_.empty()) {
      next = std::move(queue_.front());
      queue_.pop_front();
      running_ = next;
    }
    if (idle()) idle_.notify_all();
  }
  if (next) launch(std::move(next));
}

void Communicator::opPosted(CollectiveOp* op) {
  std::shared_ptr<CollectiveOp> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_.get() != op) return;  // it finished already, and opFinished moved on
    posted_.emplace(op, std::move(running_));
    running_.reset();
    if (!failing_ && !queue_.empty()) {
      next = std::move(queue_.front());
      queue_.pop_front();
      running_ = next;
    }
  }
  if (next) launch(std::move(next));
}

std::shared_ptr<CollectiveOp> Communicator::failureTarget(CollectiveOp* op) const {
  auto it = posted_.find(op);
  return it != posted_.end() ? it->second : running_;
}

void Communicator::noteArrived(int peer, uint64_t sequence) {
  auto& a = arrived_[static_cast<size_t>(peer)];
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < sequence + 1 &&
         !a.compare_exchange_weak(cur, sequence + 1, std::memory_order_relaxed)) {
  }
}

void Communicator::reportFailure(CollectiveOp* op, const Status& status, int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failing_ || !error_.ok()) return;
  failing_ = true;
  failingWith_ = status;
  std::shared_ptr<CollectiveOp> target = failureTarget(op);
  failThread_ = std::thread([this, target, status, peer] {
    handleFailure(target.get(), status, peer, false);
  });
}

void Communicator::reportTimeout(CollectiveOp* op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failing_ || !error_.ok()) return;
  // An op that completed between its deadline check and here has nothing to report (the
  // communicator is healthy).
  const bool pending =
      op == nullptr || running_.get() == op ||
      posted_.count(op) > 0 ||
      std::any_of(queue_.begin(), queue_.end(), [op](const auto& p) { return p.get() == op; });
  // Nor one that completed and is still listed until opFinished: its waiter returned OK.
  if (!pending || (op != nullptr && op->completed())) return;
  failing_ = true;
  failingWith_ = DeadlineExceeded("communicator '" + name_ + "' rank " + std::to_string(rank_) +
                                  ": an operation timed out (finding out who is missing)");
  std::shared_ptr<CollectiveOp> target = failureTarget(op);
  if (op != nullptr && target != nullptr && op != target.get() && !target->deadline().expired()) {
    // A queued op's deadline passed while an earlier one still runs within its own. The other
    // ranks have not timed out (so they publish nothing to diagnose from): say what held the
    // queue up instead of blaming ranks for it. (A running op past its own deadline is timed
    // out below as usual, naming who did not arrive.)
    const Status s = DeadlineExceeded(
        op->signature().describe() + " on communicator '" + name_ + "' (rank " +
        std::to_string(rank_) + ") reached its deadline still queued behind " +
        target->signature().describe() + ", which had not finished");
    failThread_ = std::thread([this, target, s] { handleFailure(target.get(), s, -1, false); });
    return;
  }
  failThread_ = std::thread([this, target] { handleFailure(target.get(), {}, -1, true); });
}

Duration Communicator::diagnosticGrace() const {
  auto ms = kDiagGraceMs.get();
  return Millis(ms.ok() ? *ms : kDiagGraceMs.defaultValue());
}

std::string Communicator::failKey(uint64_t sequence, int rank) const {
  (void)sequence;
  return "fail/" + std::to_string(rank);
}

Status Communicator::timeoutStatus(CollectiveOp* op) {
  if (op == nullptr) {
    return DeadlineExceeded("communicator '" + name_ + "': an operation timed out");
  }
  const OpSignature& sig = op->signature();
  std::set<int> arrived = {rank_};
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const bool seen = sig.code == OpCode::kSendRecv
                          ? op->heardFrom(p)
                          : arrived_[static_cast<size_t>(p)].load() > sig.sequence;
    if (seen) arrived.insert(p);
  }
  std::vector<int> missing;
  std::vector<int> timedOut;  // published a timeout report (read below)
  std::vector<int> silent;  // arrived, but published no timeout report within the grace
  std::vector<int> done;    // not seen, but upstream of the break in a chain broadcast (below)
  bool storeUp = true;      // the reports could be exchanged through the store
  if (sig.code == OpCode::kSendRecv) {
    for (int p = 0; p < size_; ++p) {
      if (!arrived.count(p) && p == sig.peer) missing.push_back(p);
    }
  } else {
    // Every rank that times out publishes whom it saw; the union is who arrived. Every store
    // call here ends with the grace: the store may be what failed (its host died), and the
    // report is due now, not after the store's own call timeout.
    const Deadline diag = Deadline::after(diagnosticGrace());
    const std::string base = "diag/" + std::to_string(sig.sequence) + "/";
    std::string mineText;
    for (int r : arrived) mineText += (mineText.empty() ? "" : ",") + std::to_string(r);
    storeUp = store_.setBy(base + std::to_string(rank_), toBytes(mineText), diag).ok();
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) keys.push_back(base + std::to_string(r));
    }
    if (storeUp) store_.wait(keys, diag).ignoreError();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      // Past the grace: a report there now is returned at once, a missing one times out at once.
      auto text = storeUp ? store_.get(base + std::to_string(r), diag)
                          : StatusOr<Bytes>(Unavailable("store unreachable"));
      if (!text.ok()) {
        silent.push_back(r);
        continue;
      }
      const std::string t = toString(*text);
      timedOut.push_back(r);
      size_t pos = 0;
      while (pos < t.size()) {
        size_t comma = t.find(',', pos);
        if (comma == std::string::npos) comma = t.size();
        arrived.insert(std::atoi(t.substr(pos, comma - pos).c_str()));
        pos = comma + 1;
      }
    }
    for (int r = 0; r < size_; ++r) {
      if (!arrived.count(r)) missing.push_back(r);
    }
    if (sig.code == OpCode::kBroadcast && sig.algorithm == Algorithm::kChain) {
      // The root and every rank that received and forwarded its chunks return without waiting
      // for the rest of the chain, so they publish no report, as one that never called does.
      // The ranks waiting (timed out, reports read) sit past the break; the unseen ranks before
      // the first of them in the chain did their part, except the last one, the break itself.
      // If the rank just before the first waiting one was seen (it sent part, then stalled, or
      // the timeout is short), no unseen rank is the break: every unseen one before it did
      // its part, and the message says the chain arrived without finishing.
      const auto at = [&](int r) { return (r - static_cast<int>(sig.root) + size_) % size_; };
      int firstWaiting = at(rank_);
      for (int r : timedOut) firstWaiting = std::min(firstWaiting, at(r));
      const bool breakUnseen = std::any_of(missing.begin(), missing.end(),
                                           [&](int r) { return at(r) == firstWaiting - 1; });
      const int breakAt = breakUnseen ? firstWaiting - 1 : firstWaiting;
      std::vector<int> named;
      for (int r : missing) (at(r) < breakAt ? done : named).push_back(r);
      missing = named;
      // Seen and silent: those before the rank just ahead of the first waiting one returned
      // too (the root, and whoever forwarded everything); that rank, seen but silent, is where
      // the chain stopped. They were all named "stopped or stuck".
      std::vector<int> stillSilent;
      for (int r : silent) (at(r) < firstWaiting - 1 ? done : stillSilent).push_back(r);
      silent = stillSilent;
      std::sort(done.begin(), done.end());
      done.erase(std::unique(done.begin(), done.end()), done.end());  // unseen ones are silent too
    }
  }
  std::string msg = sig.describe() + " on communicator '" + name_ + "' did not complete by its "
                    "deadline (rank " + std::to_string(rank_) + ")";
  if (!storeUp) {
    // Nobody's report could be read: say so, rather than call every peer stuck.
    msg += missing.empty()
               ? ": every rank arrived but the operation did not finish, and the store " +
                     store_.describe() + " could not be reached to learn more"
               : ": rank(s) " + rankList(missing) + " did not arrive at sequence " +
                     std::to_string(sig.sequence) + " (the store " + store_.describe() +
                     " could not be reached to learn more)";
  } else if (missing.empty() && !silent.empty()) {
    // Ranks that time out together each publish a report; one that sent its first messages
    // and then stopped (SIGSTOP, a hung kernel, a long GIL hold) publishes none.
    msg += ": every rank arrived, but rank(s) " + rankList(silent) +
           " did not report timing out within " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                              diagnosticGrace())
                              .count()) +
           " ms (stopped or stuck, or waiting with a later deadline)";
    if (!done.empty()) {
      msg += "; rank(s) " + rankList(done) +
             ", early in the broadcast's chain, did their part and returned";
    }
  } else if (missing.empty()) {
    msg += ": every rank arrived but the operation did not finish (a peer is stuck, or the "
           "timeout is too short for this size)";
    if (!done.empty()) {
      msg += "; rank(s) " + rankList(done) +
             ", early in the broadcast's chain, did their part and returned";
    }
  } else {
    msg += ": rank(s) " + rankList(missing) + " did not arrive at sequence " +
           std::to_string(sig.sequence);
    if (!done.empty()) {
      msg += " (rank(s) " + rankList(done) +
             ", before it in the broadcast's chain, did their part and returned)";
    }
  }
  return DeadlineExceeded(msg);
}

void Communicator::handleFailure(CollectiveOp* op, Status status, int peer, bool timeout) {
  if (timeout) {
    status = timeoutStatus(op);
  } else if (peer >= 0 && peer != rank_ &&
             (status.code() == StatusCode::kRemoteError || status.code() == StatusCode::kIoError ||
              status.code() == StatusCode::kCancelled)) {
    // The peer may have failed first for a reason it publishes (its transport can close the
    // connection before its failure procedure has written the cause): wait a little for it,
    // and report that cause instead of "connection closed". A dead peer never writes it.
    const std::string key = failKey(0, peer);
    auto text = store_.get(key, Deadline::after(diagnosticGrace()));
    if (text.ok()) {
      const std::string t = toString(*text);
      const size_t nl = t.find('\n');
      const int code = std::atoi(t.substr(0, nl).c_str());
      std::string message = nl == std::string::npos ? t : t.substr(nl + 1);
      if (message.find("(reported by rank") == std::string::npos) {
        message += " (reported by rank " + std::to_string(peer) + ")";
      }
      if (code > 0 && code <= static_cast<int>(StatusCode::kInternal)) {
        status = Status(static_cast<StatusCode>(code), message);
      }
    }
  }
  // Publish before closing: a peer that sees the closed connection finds the cause here. Within
  // the grace: a store that is gone must not hold the failure back.
  store_.setBy(failKey(0, rank_),
               toBytes(std::to_string(static_cast<int>(status.code())) + "\n" + status.message()),
               Deadline::after(diagnosticGrace()))
      .ignoreError();
  for (auto& c : conns_) {
    if (c) c->close();
  }
  std::shared_ptr<CollectiveOp> running;
  std::deque<std::shared_ptr<CollectiveOp>> queued;
  // Copies: posted_ keeps each op (whose transport callbacks point at it) until opFinished.
  std::vector<std::shared_ptr<CollectiveOp>> posted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = status;
    running = running_;
    queued.swap(queue_);
    for (const auto& [key, p] : posted_) posted.push_back(p);
    if (idle()) idle_.notify_all();
  }
  (void)op;
  for (auto& q : queued) q->completeUnstarted(status);
  if (running) running->failureHandled(status);
  for (auto& p : posted) p->failureHandled(status);
  // Allreduces on the path (outside the queue), after error_: notePathOp cancels later ones.
  for (const auto& p : livePathOps()) p->cancel(status);
}

}  // namespace cofab::comm
