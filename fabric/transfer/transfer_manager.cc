// TransferManager implementation. One mutex (ManagerCore::mu) guards the queue, the window, the
// stats and the records; it is never held while calling into the client, because the client
// calls back (onAcked / onDone) possibly under its own lock, and those callbacks take this one.
// Lock order: client -> core -> update.
#include "fabric/transfer/transfer_manager.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/param.h"
#include "fabric/ps/placement.h"

namespace cofab::transfer {

COFAB_PARAM_STRING(kTransferPolicy, "COFAB_TRANSFER_POLICY", "priority",
                   "TransferManager ordering policy: fifo, priority or deadline");
COFAB_PARAM_INT(kTransferInFlight, "COFAB_TRANSFER_INFLIGHT", 2, 1, 4096,
                "TransferManager: units handed to the transport and not yet acknowledged");
COFAB_PARAM_INT(kTransferOutstanding, "COFAB_TRANSFER_OUTSTANDING", 4, 1, 4096,
                "TransferManager: units handed to the transport whose result has not arrived");
COFAB_PARAM_STRING(kTransferScheduler, "COFAB_TRANSFER_SCHEDULER", "none",
                   "TransferManager: 'central' asks cofab-sched (found through COFAB_STORE) for a "
                   "grant before each unit when TransferOptions::scheduler is not set; 'none'");
COFAB_PARAM_INT(kTransferGrantTimeoutMs, "COFAB_TRANSFER_GRANT_TIMEOUT_MS", 30000, 1, 3600000,
                "TransferManager with a central scheduler: how long a unit waits for its grant");
COFAB_PARAM_INT(kTransferFuseBytes, "COFAB_TRANSFER_FUSE_BYTES", 64 << 10, 1, 1 << 30,
                "TransferManager fuses updates smaller than this (and than a chunk) into buckets");

namespace detail {

struct UpdateState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  // Fixed at enqueue.
  uint64_t key = 0;
  uint64_t iteration = 0;
  Deadline deadline = Deadline::never();
  TensorView out;
  bool fused = false;
  uint32_t unitsTotal = 0;
  std::weak_ptr<ManagerCore> core;

  // Guarded by the core's mutex.
  uint32_t unitsDone = 0;
  uint32_t unitsQueued = 0;
  uint32_t unitsInFlight = 0;
  bool cancelled = false;  // fused: keep the bucket, deliver nothing
  // Chunked: the outcome, decided while chunks were still queued to go or handed to the
  // client (they read the caller's tensor and may write its result); the handle completes
  // with it once the last of them is back (ManagerCore::completeLocked).
  bool decided = false;
  Status decidedStatus;

  bool finish(const Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return false;
      done = true;
      status = s;
    }
    cv.notify_all();
    return true;
  }
};

inline bool isDone(UpdateState& up) {
  std::lock_guard<std::mutex> lock(up.mu);
  return up.done;
}

struct Member {
  std::shared_ptr<UpdateState> update;
  size_t offset = 0;  // bytes into the bucket
  size_t bytes = 0;
};

struct Unit {
  uint64_t wireKey = 0;
  TensorView in, out;
  std::vector<uint8_t> fused;           // a bucket's buffer (reduced in place)
  std::vector<Member> members;          // a bucket's updates
  std::shared_ptr<UpdateState> update;  // a chunk's update
  ps::ReduceOp op = ps::ReduceOp::kSum;
  UnitInfo info;
  uint64_t recordId = 0;
  int destination = 0;  // by placement: the primary (see liveDestinationLocked)
  uint64_t order = 0;  // enqueue number: settles what the policy leaves equal (UnitOrder)
  // The daemon round it belongs to, taken when it was queued (enqueueUnitLocked).
  uint64_t iteration = 0;
  bool isBucket() const { return update == nullptr; }
};

// The queue in the policy's order, so that the next unit is the first one and taking any unit
// costs log n (the dispatcher scanned and erased from a vector under the mutex on every
// dispatch: quadratic in the queued chunks of a large model). Policies are total orders that
// break ties by (seq, chunk); the enqueue number makes equality impossible, so no unit is ever
// taken for a duplicate of another. `info` is fixed before a unit is queued.
struct UnitOrder {
  const OrderingPolicy* policy = nullptr;
  bool operator()(const std::shared_ptr<Unit>& a, const std::shared_ptr<Unit>& b) const {
    if (policy->before(a->info, b->info)) return true;
    if (policy->before(b->info, a->info)) return false;
    return a->order < b->order;
  }
};
using UnitQueue = std::set<std::shared_ptr<Unit>, UnitOrder>;

struct ManagerCore : std::enable_shared_from_this<ManagerCore> {
  ps::PushPullClient* client = nullptr;
  TransferOptions options;
  std::shared_ptr<const OrderingPolicy> policy;
  size_t chunkBytes = 0;
  int numServers = 1;

  mutable std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool paused = false;
  UnitQueue queue;  // ordered by `policy` once create() set it
  // Each wire key's queued units by round: only a key's earliest may leave for the wire.
  std::unordered_map<uint64_t, std::map<uint64_t, std::shared_ptr<Unit>>> queuedRounds;
  uint64_t unitsEnqueued = 0;
  std::shared_ptr<Unit> openBucket;
  std::vector<std::shared_ptr<UpdateState>> withDeadline;  // unfinished, deadline != never
  int inFlight = 0;                                        // handed over, not acknowledged
  std::vector<std::shared_ptr<Unit>> outstanding;          // handed over, result not arrived
  uint64_t seq = 0;
  uint64_t sends = 0;
  std::deque<TransferRecord> records;
  uint64_t recordBase = 0;  // id of records.front()
  TransferStats stats;
  std::thread dispatcher;
  // COFAB_TRANSFER_SCHEDULER=central without TransferOptions::scheduler: owned here.
  std::unique_ptr<Store> schedStore;
  std::unique_ptr<SchedClient> ownedScheduler;

  TransferRecord* record(uint64_t id) {
    if (id < recordBase || id - recordBase >= records.size()) return nullptr;
    return &records[static_cast<size_t>(id - recordBase)];
  }
  uint64_t addRecord(TransferRecord r) {
    records.push_back(std::move(r));
    // Finished records go first; past twice the bound an unfinished one goes too (a unit stuck
    // in flight, a bucket never flushed), so the bound holds whatever happens. A dropped
    // record's unit carries on: record() then finds nothing to update.
    while (records.size() > options.maxRecords &&
           (!records.front().outcome.empty() || records.size() > 2 * options.maxRecords)) {
      records.pop_front();
      ++recordBase;
    }
    return recordBase + records.size() - 1;
  }

  void enqueueUnitLocked(std::shared_ptr<Unit> u) {
    u->destination = ps::primaryServer(u->wireKey, 0, numServers);
    DestinationStats& d = stats.destinations[static_cast<size_t>(u->destination)];
    d.maxQueued = std::max(d.maxQueued, ++d.queued);
    if (TransferRecord* r = record(u->recordId)) r->destination = u->destination;
    if (u->update) u->update->unitsQueued++;
    u->order = unitsEnqueued++;
    u->iteration = client->reserveIteration(u->wireKey);
    auto& rounds = queuedRounds[u->wireKey];
    // A key's units travel in round order (sendableLocked), so a unit more urgent than the
    // queued ones of its key lends them its urgency: they move up the queue with it instead of
    // holding it back behind less urgent units of other keys. The queue order then keeps every
    // key's earlier rounds first, which the result window's bypass relies on.
    for (auto& [round, earlier] : rounds) {
      UnitInfo lifted = earlier->info;
      lifted.priority = std::min(lifted.priority, u->info.priority);
      lifted.deadline = std::min(lifted.deadline, u->info.deadline);
      if (lifted.priority == earlier->info.priority && lifted.deadline == earlier->info.deadline) {
        continue;
      }
      queue.erase(earlier);
      earlier->info = lifted;
      queue.insert(earlier);
      if (TransferRecord* r = record(earlier->recordId)) r->priority = lifted.priority;
    }
    rounds.emplace(u->iteration, u);
    queue.insert(std::move(u));
    stats.maxQueued = std::max<uint64_t>(stats.maxQueued, queue.size());
  }

  // Every unit leaves the queue through here, sent or dropped. Its daemon round was taken when
  // it was queued: a key's n-th unit goes to the key's n-th round on every worker, whatever
  // each worker drops (deadline, cancel, a failed grant: the unit uses its round up) and in
  // whatever order the policy takes units, so two workers' contributions to a round are always
  // the same update. Numbered only when sent, a unit took the round of one its worker had
  // dropped; numbered when it left the queue, the later of two queued units of a key took the
  // earlier round when it was dropped or preferred first. Either way it was summed with the
  // other workers' other update, every handle OK. Rounds every worker dropped are passed over
  // by the daemon (up to 8 in a row).
  void unqueuedLocked(Unit& u) {
    stats.destinations[static_cast<size_t>(u.destination)].queued--;
    if (u.update) u.update->unitsQueued--;
    auto it = queuedRounds.find(u.wireKey);
    it->second.erase(u.iteration);
    if (it->second.empty()) queuedRounds.erase(it);
  }

  // Completes `up` with `st` (the first status decided wins) and counts it; deferred while
  // chunks of it are still to be sent or are with the client.
  void completeLocked(const std::shared_ptr<UpdateState>& up, const Status& st) {
    if (!up->decided) {
      up->decided = true;
      up->decidedStatus = st;
    }
    if (!up->fused && (up->unitsInFlight > 0 || up->unitsQueued > 0)) return;
    const Status final = up->decidedStatus;
    if (!up->finish(final)) return;
    switch (final.code()) {
      case StatusCode::kOk:
        stats.updatesCompleted++;
        break;
      case StatusCode::kCancelled:
        stats.updatesCancelled++;
        break;
      case StatusCode::kDeadlineExceeded:
        stats.deadlinesMissed++;
        break;
      default:
        stats.updatesFailed++;
    }
  }

  // Removes the queued chunks of `up` (never buckets: their members' places are fixed).
  void dropQueuedLocked(const std::shared_ptr<UpdateState>& up, const std::string& outcome) {
    for (auto it = queue.begin(); it != queue.end();) {
      if ((*it)->update == up) {
        unqueuedLocked(**it);
        if (TransferRecord* r = record((*it)->recordId)) {
          r->outcome = outcome;
          r->doneNs = nowNs();
        }
        it = queue.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Where a unit goes if sent now: its primary, or the backup once the client failed over from
  // it. Grants are booked against this daemon (booked against the dead primary, the backup's
  // load went unaccounted and its budget was exceeded).
  int liveDestinationLocked(const Unit& u) const { return client->currentServer(u.wireKey); }

  std::string pendingText(const UpdateState& up) const {
    std::ostringstream os;
    os << "transfer key=" << up.key << " iteration=" << up.iteration << ": "
       << (up.unitsTotal - up.unitsDone) << " of " << up.unitsTotal << " units not done ("
       << up.unitsQueued << " queued, " << up.unitsInFlight << " handed to the transport"
       << (up.fused && up.unitsQueued == 0 && up.unitsInFlight == 0 && up.unitsDone == 0
               ? ", in an open fusion bucket: call flush()"
               : "");
    // Who the handed-over units wait for: their daemons and the round, which the daemon
    // completes once every worker pushed it.
    const char* sep = ": waiting on";
    int shown = 0;
    for (const auto& o : outstanding) {
      const bool mine = o->update.get() == &up ||
                        std::any_of(o->members.begin(), o->members.end(),
                                    [&](const Member& m) { return m.update.get() == &up; });
      if (!mine) continue;
      if (++shown > 4) {
        os << " ...";
        break;
      }
      os << sep << " aggregator " << liveDestinationLocked(*o) << " round " << o->iteration;
      sep = ",";
    }
    os << ")";
    return os.str();
  }

  void expireLocked(const std::shared_ptr<UpdateState>& up) {
    {
      std::lock_guard<std::mutex> l(up->mu);
      if (up->done) return;
    }
    const std::string why = pendingText(*up);
    if (!up->fused) dropQueuedLocked(up, "deadline_exceeded");
    completeLocked(up, DeadlineExceeded("deadline passed: " + why));
  }

  void expireDueLocked() {
    for (auto it = withDeadline.begin(); it != withDeadline.end();) {
      bool done;
      {
        std::lock_guard<std::mutex> l((*it)->mu);
        done = (*it)->done;
      }
      if (!done && (*it)->deadline.expired()) {
        expireLocked(*it);
        done = true;
      }
      it = done ? withDeadline.erase(it) : it + 1;
    }
  }

  Deadline nextDeadlineLocked() const {
    Deadline d = Deadline::never();
    for (const auto& up : withDeadline) d = d.min(up->deadline);
    return d;
  }

  void closeBucketLocked() {
    if (!openBucket) return;
    std::shared_ptr<Unit> b = std::move(openBucket);
    openBucket.reset();
    uint64_t h = 0x6275636b6574ull;  // "bucket": keeps bucket keys apart from chunk keys
    std::ostringstream name;
    name << "bucket keys=";
    for (size_t i = 0; i < b->members.size(); ++i) {
      h = ps::mix64(h ^ b->members[i].update->key);
      name << (i ? "," : "") << b->members[i].update->key;
    }
    b->wireKey = ps::mix64(h + b->members.size());
    const DType dt = b->in.dtype;
    b->in = TensorView(b->fused.data(), b->fused.size() / dtypeSize(dt), dt);
    b->out = b->in;
    if (TransferRecord* r = record(b->recordId)) {
      r->name = name.str();
      r->bytes = b->fused.size();
    }
    for (auto& m : b->members) m.update->unitsQueued++;
    enqueueUnitLocked(std::move(b));
    cv.notify_all();
  }

  void onAcked(const std::shared_ptr<Unit>& u, const Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    inFlight--;
    cv.notify_all();
    if (st.ok()) {
      if (TransferRecord* r = record(u->recordId)) r->ackedNs = nowNs();
    }
    cv.notify_all();
  }

  void onDone(const std::shared_ptr<Unit>& u, const Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    outstanding.erase(std::remove(outstanding.begin(), outstanding.end(), u), outstanding.end());
    cv.notify_all();
    if (TransferRecord* r = record(u->recordId)) {
      r->doneNs = nowNs();
      if (r->ackedNs == 0 && st.ok()) r->ackedNs = r->doneNs;
      r->outcome = st.ok() ? "ok" : st.toString();
    }
    if (u->isBucket()) {
      for (auto& m : u->members) {
        m.update->unitsInFlight--;
        m.update->unitsDone++;
        if (st.ok() && !m.update->cancelled && !isDone(*m.update)) {
          std::memcpy(m.update->out.data, u->fused.data() + m.offset, m.bytes);
        }
        completeLocked(m.update, st);
      }
      return;
    }
    UpdateState& up = *u->update;
    up.unitsInFlight--;
    up.unitsDone++;
    if (up.decided) {  // failed, cancelled or expired before: completes when the last is back
      completeLocked(u->update, up.decidedStatus);
    } else if (!st.ok()) {
      // The update fails with this status, but its other queued chunks still go out: they are
      // the other workers' missing contributions to rounds on other daemons, which would
      // otherwise wait for this worker until their deadline (grant failures are different: see
      // dispatchCentral). They read the tensor, so the handle completes once they are back.
      completeLocked(u->update, st);
    } else if (up.unitsDone == up.unitsTotal) {
      completeLocked(u->update, OkStatus());
    }
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      expireDueLocked();
      if (mayDispatchLocked()) {
        if (options.scheduler) {
          dispatchCentral(lock);
          continue;
        }
        std::shared_ptr<Unit> u = takeLocked(nextSendableLocked());
        ps::PushPullOptions po;
        po.op = u->op;
        po.iteration = u->iteration;
        auto self = shared_from_this();
        po.onAcked = [self, u](const Status& st) { self->onAcked(u, st); };
        po.onDone = [self, u](const Status& st) { self->onDone(u, st); };
        lock.unlock();
        (void)client->pushPull(u->wireKey, u->in, u->out, po);  // completion via the callbacks
        lock.lock();
        continue;
      }
      const Deadline next = nextDeadlineLocked();
      if (next.isNever()) {
        cv.wait(lock);
      } else {
        cv.wait_until(lock, next.when());
      }
    }
  }

  // A daemon takes a chunk's rounds one at a time (a push for the next round while one is open
  // is refused: window 0), so a unit waits while a unit of its wire key is still handed to the
  // transport, until that one's result is back. Such a pair arises when a key is queued again
  // while its previous update is still on the wire: cancelled, past its deadline (a fused
  // update completes at once then), or enqueued twice. The later unit used to go at once, the
  // daemon refused it, and the other workers' round for it later timed out (a sticky Aborted).
  // The wait cannot deadlock: the earlier round needs only the other workers' contributions,
  // which their queues send. `outstanding` holds a few units (the result window).
  bool keyOutLocked(uint64_t wireKey) const {
    return std::any_of(outstanding.begin(), outstanding.end(),
                       [&](const std::shared_ptr<Unit>& o) { return o->wireKey == wireKey; });
  }
  // For the same reason a key's units travel in round order: a unit waits while one of an
  // earlier round of its key is queued (enqueueUnitLocked lifts that one's urgency to its own,
  // so it comes first in the queue anyway). Units of other keys still overtake.
  bool sendableLocked(const Unit& q) const {
    return !keyOutLocked(q.wireKey) && queuedRounds.at(q.wireKey).begin()->first == q.iteration;
  }
  // The first queued unit, in the policy's order, that may travel now (queue.end() if none).
  UnitQueue::iterator nextSendableLocked() const {
    return std::find_if(queue.begin(), queue.end(),
                        [&](const std::shared_ptr<Unit>& q) { return sendableLocked(*q); });
  }

  // Removes the unit at `it` and accounts it as handed to the transport (ack and result
  // windows), and as sent in the stats and its record unless `sent` is false (its grant failed:
  // it fails through onAcked/onDone like a sent unit, but never travelled).
  std::shared_ptr<Unit> takeLocked(UnitQueue::iterator it, bool sent = true) {
    std::shared_ptr<Unit> u = *it;
    outstanding.push_back(u);
    queue.erase(it);
    unqueuedLocked(*u);
    inFlight++;
    if (u->isBucket()) {
      for (auto& m : u->members) {
        m.update->unitsQueued--;
        m.update->unitsInFlight++;
      }
    } else {
      u->update->unitsInFlight++;
    }
    if (!sent) return u;
    DestinationStats& d = stats.destinations[static_cast<size_t>(liveDestinationLocked(*u))];
    d.unitsSent++;
    d.bytesSent += u->in.bytes();
    stats.bytesSent += u->in.bytes();
    if (u->isBucket()) {
      stats.bucketsSent++;
    } else {
      stats.chunksSent++;
    }
    if (TransferRecord* r = record(u->recordId)) {
      r->sendIndex = sends;
      r->sentNs = nowNs();
      r->destination = liveDestinationLocked(*u);  // the backup once the client failed over
    }
    sends++;
    return u;
  }

  // Central mode (TransferOptions::scheduler): ask cofab-sched for a grant before the unit the
  // policy chose travels. The queued chunks of the same update are equivalent (each is its own
  // round; their order changes no result), so their destinations are all offered and the
  // scheduler picks the least loaded one that has room; the most urgent of those chunks going
  // there is sent. In the result window's bypass only the chosen unit is offered (the bypass
  // argument needs the most urgent unit). Placement is untouched: a chunk's daemon is fixed.
  void dispatchCentral(std::unique_lock<std::mutex>& lock) {
    SchedClient* sched = options.scheduler;
    const std::shared_ptr<Unit> chosen = *nextSendableLocked();
    const std::shared_ptr<UpdateState> up = chosen->update;
    std::vector<int> cands = {liveDestinationLocked(*chosen)};
    uint64_t bytes = chosen->in.bytes();  // the largest unit that may go (the grant's size)
    const bool bypass = outstanding.size() >= static_cast<size_t>(options.maxOutstanding);
    if (up && !bypass) {
      for (const auto& q : queue) {
        if (q->update != up || !sendableLocked(*q)) continue;
        bytes = std::max<uint64_t>(bytes, q->in.bytes());
        const int dest = liveDestinationLocked(*q);
        if (std::find(cands.begin(), cands.end(), dest) == cands.end()) {
          cands.push_back(dest);
        }
      }
    }
    Deadline d = Deadline::afterMs(options.grantTimeoutMs);
    if (up && up->deadline.when() < d.when()) d = up->deadline;
    lock.unlock();
    StatusOr<SchedGrant> grant = sched->acquire(cands, bytes, d);
    lock.lock();
    auto equivalent = [&](const std::shared_ptr<Unit>& q) {
      return q == chosen || (up && !bypass && q->update == up);
    };
    if (!grant.ok()) {  // fail the chosen unit if it is still queued
      auto it = queue.find(chosen);
      if (it == queue.end()) return;
      std::shared_ptr<Unit> u = takeLocked(it, /*sent=*/false);
      // The update fails with this unit: its other chunks would each wait for a grant in vain.
      if (up) dropQueuedLocked(up, "grant_failed");
      lock.unlock();
      onAcked(u, grant.status());
      onDone(u, grant.status());
      lock.lock();
      return;
    }
    const SchedGrant g = *grant;
    if (paused || stop) {  // pause() or the destructor came while the grant was awaited
      sched->giveBack(g);
      return;
    }
    // The most urgent equivalent unit going there: the first in queue order.
    auto pick = std::find_if(queue.begin(), queue.end(), [&](const std::shared_ptr<Unit>& q) {
      return equivalent(q) && liveDestinationLocked(*q) == g.destination && sendableLocked(*q);
    });
    if (pick == queue.end()) {  // dropped meanwhile (cancel, deadline): give the grant back
      sched->giveBack(g);
      return;
    }
    std::shared_ptr<Unit> u = takeLocked(pick);
    ps::PushPullOptions po;
    po.op = u->op;
    po.iteration = u->iteration;
    auto self = shared_from_this();
    // The ack may arrive after the manager and the SchedClient are gone: keep the reporter.
    po.onAcked = [self, u, report = sched->deliveryReporter(), g](const Status& st) {
      report(g);  // also on failure: the bytes are no longer on their way
      self->onAcked(u, st);
    };
    po.onDone = [self, u](const Status& st) { self->onDone(u, st); };
    lock.unlock();
    (void)client->pushPull(u->wireKey, u->in, u->out, po);
    lock.lock();
  }

  // Two windows. The ack window (maxInFlight units not acknowledged) keeps the transport queue
  // short, so that a new urgent unit waits for at most that many. The result window
  // (maxOutstanding units whose result has not arrived) keeps the daemons' result queues short
  // too (results come back in the order rounds complete, which the manager cannot reorder).
  // Results depend on the other workers, so a full result window could deadlock workers that
  // picked in different orders; hence the bypass: when every outstanding unit is acknowledged
  // (waits only for others), a queued unit more urgent than all of them may still go. The most
  // urgent unfinished unit of the job can then always be sent by every worker that has it
  // queued, so no cycle of waits can form, as long as the policy's order is the same on every
  // worker (fifo, priority; deadline when the deadlines agree — and a missed deadline ends any
  // wait anyway). The unit weighed is the most urgent sendable one (sendableLocked): one held
  // for its own key's earlier round waits only for that round, which every other worker's
  // queue sends, so it adds no cycle.
  bool mayDispatchLocked() const {
    if (paused || queue.empty() || inFlight >= options.maxInFlight) return false;
    const auto next = nextSendableLocked();
    if (next == queue.end()) return false;
    if (outstanding.size() < static_cast<size_t>(options.maxOutstanding)) return true;
    if (inFlight > 0) return false;
    const UnitInfo& best = (*next)->info;
    for (const auto& o : outstanding) {
      if (!policy->before(best, o->info)) return false;
    }
    return true;
  }

  TransferHandle enqueue(const GradientUpdate& g) {
    auto up = std::make_shared<UpdateState>();
    up->key = g.key;
    up->iteration = g.iteration;
    up->deadline = g.deadline;
    up->core = weak_from_this();
    TransferHandle handle(up);
    const bool inPlace = g.out.data == nullptr && g.out.count == 0;
    up->out = inPlace ? g.tensor : g.out;
    Status bad = validate(g, up->out);
    std::lock_guard<std::mutex> lock(mu);
    stats.updatesEnqueued++;
    if (!bad.ok()) {
      completeLocked(up, bad.withContext("enqueue key=" + std::to_string(g.key)));
      return handle;
    }
    if (stop) {
      completeLocked(up, Cancelled("transfer manager is shutting down"));
      return handle;
    }
    const uint64_t mySeq = seq++;
    const size_t bytes = g.tensor.bytes();
    const int64_t now = nowNs();
    if (bytes == 0) {
      completeLocked(up, OkStatus());
      return handle;
    }
    if (!g.deadline.isNever()) {
      withDeadline.push_back(up);
      // The dispatcher may be asleep with no deadline to wake for, and a fused update wakes it
      // for nothing else (its bucket may never fill): it must still fail at its deadline.
      cv.notify_all();
    }
    if (bytes < options.fuseBelowBytes) {
      up->fused = true;
      up->unitsTotal = 1;
      if (openBucket && (openBucket->in.dtype != g.tensor.dtype || openBucket->op != g.op)) {
        closeBucketLocked();
      }
      // A bucket is one wire chunk at most (bucketBytes <= chunkBytes, and every fused update is
      // smaller than a chunk: see create()): close the open one if this update would overflow it.
      if (openBucket && openBucket->fused.size() + bytes > options.bucketBytes) {
        closeBucketLocked();
      }
      if (!openBucket) {
        openBucket = std::make_shared<Unit>();
        openBucket->in.dtype = g.tensor.dtype;
        openBucket->op = g.op;
        openBucket->info.seq = mySeq;
        openBucket->info.priority = g.priority;
        openBucket->info.deadline = g.deadline.when();
        TransferRecord r;
        r.fused = true;
        r.priority = g.priority;
        r.iteration = g.iteration;
        r.sendsAtEnqueue = sends;
        r.queuedNs = now;
        openBucket->recordId = addRecord(std::move(r));
      }
      Unit& b = *openBucket;
      Member m{up, b.fused.size(), bytes};
      const auto* src = static_cast<const uint8_t*>(g.tensor.data);
      b.fused.insert(b.fused.end(), src, src + bytes);  // the gradient is final at enqueue
      b.members.push_back(m);
      b.info.priority = std::min(b.info.priority, g.priority);
      b.info.deadline = std::min(b.info.deadline, g.deadline.when());
      if (TransferRecord* r = record(b.recordId)) {
        r->keys.push_back(g.key);
        r->priority = b.info.priority;
      }
      if (b.fused.size() >= options.bucketBytes) closeBucketLocked();
      return handle;
    }
    const ps::ChunkLayout layout =
        ps::chunkLayout(g.tensor.count, dtypeSize(g.tensor.dtype), chunkBytes);
    up->unitsTotal = layout.chunkCount;
    for (uint32_t c = 0; c < layout.chunkCount; ++c) {
      auto u = std::make_shared<Unit>();
      const size_t first = static_cast<size_t>(c) * layout.elementsPerChunk;
      const size_t n = std::min(layout.elementsPerChunk, g.tensor.count - first);
      u->wireKey = ps::mix64(ps::mix64(g.key ^ 0x6368756e6bull /* "chunk" */) + c);
      u->in = g.tensor.slice(first, n);
      u->out = up->out.slice(first, n);
      u->update = up;
      u->op = g.op;
      u->info = UnitInfo{mySeq, c, g.priority, g.deadline.when()};
      TransferRecord r;
      r.name = "key=" + std::to_string(g.key) + " chunk=" + std::to_string(c) + "/" +
               std::to_string(layout.chunkCount);
      r.keys = {g.key};
      r.chunk = c;
      r.chunks = layout.chunkCount;
      r.priority = g.priority;
      r.iteration = g.iteration;
      r.bytes = u->in.bytes();
      r.sendsAtEnqueue = sends;
      r.queuedNs = now;
      u->recordId = addRecord(std::move(r));
      enqueueUnitLocked(std::move(u));
    }
    cv.notify_all();
    return handle;
  }

  static Status validate(const GradientUpdate& g, const TensorView& out) {
    COFAB_RETURN_IF_ERROR(g.tensor.validate("tensor"));
    COFAB_RETURN_IF_ERROR(out.validate("out"));
    COFAB_RETURN_IF_ERROR(checkSameShape(g.tensor, out, "GradientUpdate tensor/out"));
    // Each chunk is its own pushPull, so the client's own check sees disjoint slices: a partial
    // overlap has to be refused here, where the whole tensor is known.
    COFAB_RETURN_IF_ERROR(checkInPlaceOrDisjoint(g.tensor, out, "GradientUpdate tensor/out"));
    if (!g.tensor.device.isCpu() || !out.device.isCpu()) {
      return InvalidArgument("the transfer manager takes host tensors; got " + g.tensor.toString());
    }
    switch (g.tensor.dtype) {
      case DType::kF32:
      case DType::kF64:
      case DType::kF16:
      case DType::kBF16:
        return OkStatus();
      default:
        return InvalidArgument("aggregation supports f32, f64, f16 and bf16; got " +
                               std::string(dtypeName(g.tensor.dtype)));
    }
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stop) return;
      stop = true;
    }
    cv.notify_all();
    if (dispatcher.joinable()) dispatcher.join();
    std::lock_guard<std::mutex> lock(mu);
    const Status why = Cancelled("transfer manager destroyed before the update was sent");
    if (openBucket) {
      for (auto& m : openBucket->members) completeLocked(m.update, why);
      openBucket.reset();
    }
    for (auto& u : queue) {
      unqueuedLocked(*u);
      if (TransferRecord* r = record(u->recordId)) r->outcome = "cancelled";
      if (u->isBucket()) {
        for (auto& m : u->members) completeLocked(m.update, why);
      } else {
        completeLocked(u->update, why);
      }
    }
    queue.clear();
  }
};

}  // namespace detail

using detail::ManagerCore;
using detail::UpdateState;

namespace {

// Fails `up` for good once its own deadline has passed, without waiting for the dispatcher to
// notice (it may be waiting for another unit's grant, up to grantTimeoutMs): what wait(),
// test() and status() see agrees. Returns whether `up` is done.
bool expireIfDue(const std::shared_ptr<UpdateState>& up) {
  {
    std::lock_guard<std::mutex> lock(up->mu);
    if (up->done) return true;
  }
  if (!up->deadline.expired()) return false;
  if (auto core = up->core.lock()) {
    std::lock_guard<std::mutex> lock(core->mu);
    core->expireLocked(up);
  } else {
    up->finish(DeadlineExceeded("transfer key=" + std::to_string(up->key) + ": deadline passed"));
  }
  std::lock_guard<std::mutex> lock(up->mu);
  return up->done;  // false while chunks handed to the client are still out
}

}  // namespace

bool TransferHandle::test() const { return !state_ || expireIfDue(state_); }

Status TransferHandle::status() const {
  if (!state_) return FailedPrecondition("status() on an invalid TransferHandle");
  expireIfDue(state_);
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done ? state_->status : Unavailable("in progress");
}

uint64_t TransferHandle::key() const { return state_ ? state_->key : 0; }

Status TransferHandle::wait(Deadline deadline) const {
  if (!state_) return FailedPrecondition("wait() on an invalid TransferHandle");
  const Deadline until = deadline.min(state_->deadline);
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    while (!state_->done) {
      if (state_->cv.wait_until(lock, until.when()) == std::cv_status::timeout) break;
    }
    if (state_->done) return state_->status;
  }
  const bool expired = state_->deadline.expired();  // the update's own: it fails for good
  if (expired && expireIfDue(state_)) {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->status;
  }
  auto core = state_->core.lock();
  if (!core) return DeadlineExceeded("transfer key=" + std::to_string(state_->key));
  std::lock_guard<std::mutex> lock(core->mu);
  if (expired) {  // chunks are with the client: the tensors stay lent until back
    std::lock_guard<std::mutex> l(state_->mu);
    if (state_->done) return state_->status;  // they came back meanwhile
    return DeadlineExceeded("deadline passed: " + core->pendingText(*state_) +
                            "; the handle completes once those handed over are back");
  }
  return DeadlineExceeded("waiting for " + core->pendingText(*state_));
}

StatusOr<std::unique_ptr<TransferManager>> TransferManager::create(ps::PushPullClient& client,
                                                                   const TransferOptions& options) {
  auto core = std::make_shared<ManagerCore>();
  core->client = &client;
  core->options = options;
  TransferOptions& o = core->options;
  if (o.policy.empty()) {
    COFAB_ASSIGN_OR_RETURN(o.policy, kTransferPolicy.get());
  }
  COFAB_ASSIGN_OR_RETURN(core->policy, makeOrderingPolicy(o.policy));
  core->queue = detail::UnitQueue(detail::UnitOrder{core->policy.get()});
  if (o.maxInFlight < 0) {
    return InvalidArgument("TransferOptions::maxInFlight must be >= 1 (0: the default)");
  }
  if (o.maxInFlight == 0) {
    COFAB_ASSIGN_OR_RETURN(int64_t v, kTransferInFlight.get());
    o.maxInFlight = static_cast<int>(v);
  }
  if (o.maxOutstanding < 0) {
    return InvalidArgument("TransferOptions::maxOutstanding must be >= 1 (0: the default)");
  }
  if (o.maxOutstanding == 0) {
    COFAB_ASSIGN_OR_RETURN(int64_t v, kTransferOutstanding.get());
    o.maxOutstanding = static_cast<int>(v);
  }
  o.maxOutstanding = std::max(o.maxOutstanding, o.maxInFlight);
  if (o.grantTimeoutMs < 0) return InvalidArgument("TransferOptions::grantTimeoutMs must be >= 0");
  if (o.grantTimeoutMs == 0) {
    COFAB_ASSIGN_OR_RETURN(o.grantTimeoutMs, kTransferGrantTimeoutMs.get());
  }
  if (o.fuseBelowBytes == 0) {
    COFAB_ASSIGN_OR_RETURN(int64_t v, kTransferFuseBytes.get());
    o.fuseBelowBytes = static_cast<size_t>(v);
  }
  // A unit must be one wire chunk of the client, so that the manager alone decides the order.
  core->chunkBytes =
      o.chunkBytes == 0 ? client.chunkBytes() : std::min(o.chunkBytes, client.chunkBytes());
  if (o.bucketBytes == 0 || o.bucketBytes > core->chunkBytes) o.bucketBytes = core->chunkBytes;
  // A bucket is one wire chunk at most, so a fused update must fit in one: larger ones (from
  // fuseBelowBytes or COFAB_TRANSFER_FUSE_BYTES above the chunk size) are chunked instead.
  o.fuseBelowBytes = std::min(o.fuseBelowBytes, core->chunkBytes);
  if (o.maxRecords == 0) o.maxRecords = 1;
  if (o.scheduler == nullptr) {
    COFAB_ASSIGN_OR_RETURN(std::string mode, kTransferScheduler.get());
    if (mode == "central") {
      std::string url;
      if (!rawParamValue("COFAB_STORE", &url) || url.empty()) {
        return InvalidArgument(
            "COFAB_TRANSFER_SCHEDULER=central needs COFAB_STORE (where cofab-sched registered) "
            "or TransferOptions::scheduler");
      }
      COFAB_ASSIGN_OR_RETURN(core->schedStore, openStore(url, Deadline::afterMs(60000)));
      COFAB_ASSIGN_OR_RETURN(core->ownedScheduler,
                             SchedClient::connect(*core->schedStore, client.rank()));
      o.scheduler = core->ownedScheduler.get();
    } else if (mode != "none") {
      return InvalidArgument("COFAB_TRANSFER_SCHEDULER must be 'central' or 'none', not '" + mode +
                             "'");
    }
  }
  core->numServers = std::max(1, client.numServers());
  core->stats.destinations.resize(static_cast<size_t>(core->numServers));
  core->paused = o.startPaused;
  ManagerCore* raw = core.get();
  core->dispatcher = std::thread([raw] { raw->run(); });
  return std::unique_ptr<TransferManager>(new TransferManager(std::move(core)));
}

TransferManager::TransferManager(std::shared_ptr<ManagerCore> core) : core_(std::move(core)) {}
TransferManager::~TransferManager() { core_->shutdown(); }

TransferHandle TransferManager::enqueue(const GradientUpdate& update) {
  return core_->enqueue(update);
}

void TransferManager::flush() {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->closeBucketLocked();
}

Status TransferManager::cancel(const TransferHandle& handle) {
  if (!handle.state_) return FailedPrecondition("cancel() of an invalid TransferHandle");
  const auto& up = handle.state_;
  if (up->core.lock() != core_) {
    // Its state is guarded by its own manager's mutex, not this one's.
    return InvalidArgument("cancel() of a TransferHandle from another TransferManager");
  }
  std::lock_guard<std::mutex> lock(core_->mu);
  {
    std::lock_guard<std::mutex> l(up->mu);
    if (up->done) {
      return FailedPrecondition("transfer key=" + std::to_string(up->key) +
                                " already finished: " + up->status.toString());
    }
  }
  if (up->decided) {  // failed or past its deadline, waiting for chunks the client still has
    return FailedPrecondition("transfer key=" + std::to_string(up->key) +
                              " already failed: " + up->decidedStatus.toString());
  }
  if (up->fused) {
    up->cancelled = true;  // the bucket still travels; nothing is delivered to this update
  } else {
    core_->dropQueuedLocked(up, "cancelled");
  }
  core_->completeLocked(up, Cancelled("transfer key=" + std::to_string(up->key) + " cancelled"));
  return OkStatus();
}

void TransferManager::pause() {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->paused = true;
}

void TransferManager::resume() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->paused = false;
  }
  core_->cv.notify_all();
}

TransferStats TransferManager::stats() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->stats;
}

std::vector<TransferRecord> TransferManager::records() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return {core_->records.begin(), core_->records.end()};
}

Status TransferManager::writeTrace(const std::string& path) const {
  const int rank = core_->client->rank();
  return writeChromeTrace(path, records(), rank, "worker " + std::to_string(rank));
}

std::string TransferManager::policyName() const { return std::string(core_->policy->name()); }

}  // namespace cofab::transfer
