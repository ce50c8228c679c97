// SchedClient implementation: one mutex guards the pending requests and the sticky error; the
// receive loop runs on the client's transport I/O thread.
#include "fabric/transfer/sched_client.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "fabric/transfer/central_scheduler.h"
#include "fabric/transport/registry.h"

namespace cofab::transfer {
namespace {
// A pacing delay longer than this (about 12 days) is taken as this: it keeps now + delay from
// overflowing the clock, and is past any deadline a caller gives.
constexpr uint64_t kMaxPaceUs = uint64_t{1} << 40;
constexpr uint64_t kUnused = 1;  // kDelivered's iteration for a grant given back unused
}  // namespace

struct SchedClient::Impl : std::enable_shared_from_this<Impl> {
  std::shared_ptr<transport::Context> ctx;
  std::shared_ptr<transport::Connection> conn;
  std::string address;
  int rank = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  Status error;         // sticky
  bool closed = false;  // the SchedClient was destroyed
  uint64_t nextId = 1;
  struct Pending {
    bool answered = false;
    Status refused;
    SchedGrant grant;
  };
  std::map<uint64_t, Pending> pending;
  // Requests whose acquire() gave up (deadline): the scheduler may still grant them, and such a
  // grant goes straight back (kDelivered), or its bytes would count against the destination
  // for as long as this connection lives.
  std::set<uint64_t> abandoned;
  SchedClientStats stats;

  std::string who() const { return "cofab-sched at " + address; }

  void postRecv() {
    auto self = shared_from_this();
    conn->recvOwned([self](const Status& st, const wire::Header& h, std::vector<uint8_t>&& p) {
      std::unique_lock<std::mutex> lock(self->mu);
      if (!st.ok()) {
        if (self->error.ok()) {
          self->error =
              Unavailable("the central scheduler (" + self->who() + ") is gone: " + st.toString());
        }
        self->cv.notify_all();
        return;
      }
      const auto op = static_cast<SchedOp>(h.opcode);
      auto it = self->pending.find(h.key);
      const bool answer = h.type == wire::MessageType::kControl &&
                          (op == SchedOp::kGrant || op == SchedOp::kRefuse);
      if (answer && self->abandoned.erase(h.key) != 0) {
        if (op == SchedOp::kGrant && !self->closed) {
          self->stats.lateGrantsReturned++;
          self->send(SchedOp::kDelivered, h.key, h.sequence, kUnused);
        }
      } else if (answer && it != self->pending.end()) {
        it->second.answered = true;
        if (op == SchedOp::kGrant) {
          it->second.grant.id = h.key;
          it->second.grant.destination = static_cast<int>(h.sequence);
          // The scheduler's word, bounded so that now + delay cannot overflow; a delay past
          // the caller's deadline is refused by acquire() either way.
          it->second.grant.delayUs =
              static_cast<int64_t>(std::min<uint64_t>(h.iteration, kMaxPaceUs));
        } else {
          it->second.refused = InvalidArgument(std::string(p.begin(), p.end()));
        }
        self->cv.notify_all();
      } else if (self->error.ok()) {
        self->error = Internal(self->who() + " sent an unexpected message: " + h.describe());
        self->cv.notify_all();
      }
      lock.unlock();
      self->postRecv();
    });
  }

  // After the client's destructor (closed) this does nothing. `unused`: the grant is given back
  // without its unit having travelled (its pacing slot is returned too).
  void delivered(const SchedGrant& grant, bool unused = false) {
    // Sent under the lock (sends never call back inline), so the destructor's join cannot
    // slip in between the check and the send.
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    stats.delivered++;
    send(SchedOp::kDelivered, grant.id, static_cast<uint64_t>(grant.destination),
         unused ? kUnused : 0);
  }

  void send(SchedOp op, uint64_t id, uint64_t seq, uint64_t it,
            std::shared_ptr<std::vector<uint8_t>> payload = nullptr) {
    wire::Header h;
    h.type = wire::MessageType::kControl;
    h.opcode = static_cast<uint8_t>(op);
    h.senderRank = static_cast<uint32_t>(rank);
    h.key = id;
    h.sequence = seq;
    h.iteration = it;
    if (!payload) payload = std::make_shared<std::vector<uint8_t>>();
    // A failure shows up in the receive loop.
    conn->send(h, payload->data(), payload->size(), [payload](const Status&) {});
  }
};

StatusOr<std::unique_ptr<SchedClient>> SchedClient::connect(Store& store, int rank,
                                                            const SchedClientOptions& options) {
  SchedClientOptions o = options;
  if (o.address.empty()) {
    const std::string key = schedulerAddressKey(o.storePrefix);
    auto addr = store.get(key, Deadline::afterMs(o.connectTimeoutMs));
    if (!addr.ok() && addr.status().code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceeded("central scheduler (cofab-sched) did not register '" + key +
                              "' in the store: " + addr.status().toString());
    }
    // Any other store failure (the store server gone, say) keeps its own code.
    if (!addr.ok()) {
      return addr.status().withContext("central scheduler (cofab-sched) address '" + key + "'");
    }
    o.address.assign(addr->begin(), addr->end());
  }
  return connect(rank, o);
}

StatusOr<std::unique_ptr<SchedClient>> SchedClient::connect(int rank,
                                                            const SchedClientOptions& options) {
  if (options.address.empty()) return InvalidArgument("SchedClient: no scheduler address");
  auto impl = std::make_shared<Impl>();
  impl->address = options.address;
  impl->rank = rank;
  transport::ContextOptions co;
  co.localId = "worker " + std::to_string(rank);
  COFAB_ASSIGN_OR_RETURN(impl->ctx, transport::Registry::create(options.transport, co));
  transport::ConnectOptions cn;
  cn.localId = co.localId;
  auto c = impl->ctx->connect(options.address, cn, Deadline::afterMs(options.connectTimeoutMs));
  if (!c.ok()) {
    impl->ctx->join();
    return Unavailable("cannot reach the central scheduler (" + impl->who() +
                       "): " + c.status().toString());
  }
  impl->conn = std::move(c).value();
  impl->postRecv();
  return std::unique_ptr<SchedClient>(new SchedClient(std::move(impl)));
}

SchedClient::~SchedClient() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->closed = true;
  }
  impl_->ctx->join();  // closes the connection; the receive loop has ended afterwards
}

StatusOr<SchedGrant> SchedClient::acquire(const std::vector<int>& candidates, uint64_t bytes,
                                          Deadline deadline) {
  if (deadline.isNever()) {
    return InvalidArgument(
        "SchedClient::acquire needs a deadline: a scheduler that never answers "
        "would hold the caller forever");
  }
  Impl& s = *impl_;
  auto payload = std::make_shared<std::vector<uint8_t>>();
  std::string destination;
  for (int d : candidates) {
    const auto v = static_cast<uint32_t>(d);
    for (int b = 0; b < 4; ++b) payload->push_back(static_cast<uint8_t>(v >> (8 * b)));
    destination += (destination.empty() ? "" : "|") + std::to_string(d);
  }
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.error.ok()) return s.error;
  const uint64_t id = s.nextId++;
  s.pending[id] = {};
  s.stats.requests++;
  s.send(SchedOp::kRequest, id, 0, bytes, payload);
  for (;;) {
    auto it = s.pending.find(id);
    if (it->second.answered) {
      Impl::Pending p = it->second;
      s.pending.erase(it);
      if (!p.refused.ok()) return p.refused;
      s.stats.grants++;
      s.stats.pacedUs += p.grant.delayUs;
      lock.unlock();
      if (p.grant.delayUs > 0) {
        const auto start = Clock::now() + std::chrono::microseconds(p.grant.delayUs);
        if (deadline.when() < start) {
          // Refused at once, not after sleeping to the deadline: the bytes (and the pacing
          // slot) go back to the scheduler now and the caller's dispatcher is not held for
          // nothing.
          s.delivered(p.grant, /*unused=*/true);
          return DeadlineExceeded(
              "grant from " + s.who() + " for destination " + std::to_string(p.grant.destination) +
              " starts in " + std::to_string(p.grant.delayUs / 1000) + " ms, after the deadline");
        }
        std::this_thread::sleep_until(start);
      }
      return p.grant;
    }
    if (!s.error.ok()) {
      s.pending.erase(it);
      return s.error;
    }
    const bool timedOut = s.cv.wait_until(lock, deadline.when()) == std::cv_status::timeout;
    if (timedOut && !s.pending.at(id).answered && s.error.ok()) {
      s.pending.erase(id);
      s.abandoned.insert(id);
      return DeadlineExceeded("no grant from the central scheduler (" + s.who() + ") for " +
                              std::to_string(bytes) + " bytes to destination " + destination +
                              " (" + std::to_string(s.pending.size()) + " other requests waiting)");
    }
  }
}

void SchedClient::delivered(const SchedGrant& grant) { impl_->delivered(grant); }
void SchedClient::giveBack(const SchedGrant& grant) { impl_->delivered(grant, /*unused=*/true); }

std::function<void(const SchedGrant&)> SchedClient::deliveryReporter() const {
  return [impl = impl_](const SchedGrant& grant) { impl->delivered(grant); };
}

const std::string& SchedClient::address() const { return impl_->address; }

SchedClientStats SchedClient::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

Status SchedClient::status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->error;
}

}  // namespace cofab::transfer
