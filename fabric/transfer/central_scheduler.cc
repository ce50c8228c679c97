// CentralScheduler implementation: one mutex guards every queue and counter; messages arrive on
// the transport's I/O threads and grants are sent from there (sends never block).
#include "fabric/transfer/central_scheduler.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "core/clock.h"
#include "core/log.h"
#include "core/param.h"
#include "fabric/transport/registry.h"

namespace cofab::transfer {

COFAB_PARAM_INT(kSchedDestBytes, "COFAB_SCHED_DEST_BYTES", 8 << 20, 1, int64_t{1} << 40,
                "cofab-sched: bytes granted and not yet delivered per destination");
COFAB_PARAM_INT(kSchedRate, "COFAB_SCHED_RATE", 0, 0, int64_t{1} << 40,
                "cofab-sched: pacing per destination in bytes/s (0: unpaced)");

std::string schedulerAddressKey(const std::string& prefix) { return prefix + "/address"; }

StatusOr<int64_t> parseDestBytes(const std::string& text, const std::string& source) {
  return kSchedDestBytes.parse(text, source);
}
StatusOr<int64_t> parseRate(const std::string& text, const std::string& source) {
  return kSchedRate.parse(text, source);
}

namespace {

struct Conn {
  std::shared_ptr<transport::Connection> conn;
  bool closed = false;
  std::set<uint64_t> waiting;  // request ids queued and not granted yet
};

// Queued in the queue of each of its candidate destinations; the first grant wins and the other
// entries go stale (skipped when they reach the head).
struct Request {
  std::shared_ptr<Conn> from;
  uint64_t id = 0;
  uint64_t bytes = 0;
  bool granted = false;
};

struct Grant {
  std::shared_ptr<Conn> to;
  int dest = 0;
  uint64_t bytes = 0;
  int64_t paceEndNs = 0;  // the end of the pacing slot it booked (0: unpaced)
};

}  // namespace

struct CentralScheduler::Impl : std::enable_shared_from_this<Impl> {
  SchedulerOptions options;
  std::shared_ptr<transport::Context> ctx;
  std::unique_ptr<transport::Listener> listener;
  std::string address;

  mutable std::mutex mu;
  bool stopped = false;
  std::vector<std::deque<std::shared_ptr<Request>>> queues;
  std::vector<int64_t> nextFreeNs;  // per destination: pacing clock
  // Per destination: the ends of the slots booked by grants not given back unused. The clock
  // never runs past the last of them (or now): a grant given back unused takes its slot out,
  // whichever order grants come back in.
  std::vector<std::multiset<int64_t>> bookedEnds;
  std::map<std::pair<const Conn*, uint64_t>, Grant> grants;  // (connection, request id)
  std::vector<std::shared_ptr<Conn>> conns;
  SchedulerStats stats;

  void acceptNext() {
    auto self = shared_from_this();
    listener->acceptAsync([self](const Status& st, std::shared_ptr<transport::Connection> c) {
      if (!st.ok()) return;  // closed
      auto conn = std::make_shared<Conn>();
      conn->conn = std::move(c);
      {
        std::lock_guard<std::mutex> lock(self->mu);
        if (self->stopped) {
          conn->conn->close();
          return;
        }
        self->conns.push_back(conn);
      }
      self->postRecv(conn);
      self->acceptNext();
    });
  }

  void postRecv(const std::shared_ptr<Conn>& c) {
    auto self = shared_from_this();
    c->conn->recvOwned(
        [self, c](const Status& st, const wire::Header& h, std::vector<uint8_t>&& payload) {
          if (!st.ok()) {
            self->onClosed(c);
            return;
          }
          self->onMessage(c, h, payload);
          self->postRecv(c);
        });
  }

  void send(const std::shared_ptr<Conn>& c, SchedOp op, uint64_t id, uint64_t seq, uint64_t it,
            std::string text = {}) {
    wire::Header h;
    h.type = wire::MessageType::kControl;
    h.opcode = static_cast<uint8_t>(op);
    h.key = id;
    h.sequence = seq;
    h.iteration = it;
    auto buf = std::make_shared<std::string>(std::move(text));
    c->conn->send(h, buf->data(), buf->size(), [buf](const Status&) {});
  }

  void onMessage(const std::shared_ptr<Conn>& c, const wire::Header& h,
                 const std::vector<uint8_t>& payload) {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return;
    const auto op = static_cast<SchedOp>(h.opcode);
    if (h.type != wire::MessageType::kControl) {
      stats.protocolErrors++;
      return;
    }
    if (op == SchedOp::kRequest) {
      // Payload: the candidate destinations, u32 little-endian each (at least one, each at most
      // once: a list longer than the destinations, or with repeats, would queue one request many
      // times, and a peer could make that list as long as a message).
      const size_t listed = payload.size() / 4;
      bool bad = listed == 0 || payload.size() % 4 != 0 || h.iteration == 0 ||
                 listed > static_cast<size_t>(options.numDestinations);
      std::vector<uint32_t> cands;
      if (!bad) {
        std::vector<bool> seen(static_cast<size_t>(options.numDestinations), false);
        for (size_t i = 0; i < listed && !bad; ++i) {
          const uint32_t d = static_cast<uint32_t>(payload[4 * i]) |
                             static_cast<uint32_t>(payload[4 * i + 1]) << 8 |
                             static_cast<uint32_t>(payload[4 * i + 2]) << 16 |
                             static_cast<uint32_t>(payload[4 * i + 3]) << 24;
          bad = d >= static_cast<uint32_t>(options.numDestinations) || seen[d];
          if (!bad) seen[d] = true;
          cands.push_back(d);
        }
      }
      if (bad) {
        stats.protocolErrors++;
        send(c, SchedOp::kRefuse, h.key, 0, 0,
             "cofab-sched: bad request (" + std::to_string(listed) +
                 " candidate destinations, each below " + std::to_string(options.numDestinations) +
                 " and listed once wanted, " + std::to_string(h.iteration) + " bytes)");
        return;
      }
      if (h.iteration > kMaxRequestBytes) {
        stats.protocolErrors++;
        send(c, SchedOp::kRefuse, h.key, 0, 0,
             "cofab-sched: request " + std::to_string(h.key) + " for " +
                 std::to_string(h.iteration) + " bytes is above the limit of " +
                 std::to_string(kMaxRequestBytes) + " bytes (1 GiB) per unit");
        return;
      }
      if (c->waiting.count(h.key) != 0 || grants.count({c.get(), h.key}) != 0) {
        // A second grant under one id would overwrite the first, whose bytes then never come
        // back (its delivery releases only one).
        stats.protocolErrors++;
        send(c, SchedOp::kRefuse, h.key, 0, 0,
             "cofab-sched: request id " + std::to_string(h.key) +
                 " is already waiting or granted on this connection");
        return;
      }
      c->waiting.insert(h.key);
      auto r = std::make_shared<Request>(Request{c, h.key, h.iteration, false});
      for (uint32_t d : cands) {
        queues[d].push_back(r);
        auto& ds = stats.destinations[d];
        ds.queued = queues[d].size();
        ds.maxQueued = std::max(ds.maxQueued, ds.queued);
      }
      grantLocked();
    } else if (op == SchedOp::kDelivered) {
      auto it = grants.find({c.get(), h.key});
      if (it == grants.end()) {  // never granted, or delivered twice
        stats.protocolErrors++;
        COFAB_LOG(kWarn, "sched") << "delivery of unknown or already delivered request " << h.key
                                  << " from " << c->conn->peerId();
        return;
      }
      auto& ds = stats.destinations[static_cast<size_t>(it->second.dest)];
      ds.delivered++;
      ds.load -= it->second.bytes;
      if (h.iteration == 1 && it->second.paceEndNs != 0) {
        // Unused: its slot goes back, or a burst of refused grants (each paced past its
        // caller's deadline) would run the clock ahead of real time and fail every later one.
        // The clock falls back to the end of the last slot still booked, never below now: a
        // slot with later ones booked after it leaves a gap rather than an overlap.
        const auto d = static_cast<size_t>(it->second.dest);
        auto& ends = bookedEnds[d];
        if (auto e = ends.find(it->second.paceEndNs); e != ends.end()) ends.erase(e);
        const int64_t now = nowNs();
        while (!ends.empty() && *ends.begin() <= now) ends.erase(ends.begin());
        nextFreeNs[d] = ends.empty() ? now : std::max(now, *ends.rbegin());
      }
      grants.erase(it);
      grantLocked();
    } else {
      stats.protocolErrors++;
    }
  }

  // Grants while some destination with a queued request has room, least loaded first: a request
  // with several candidates goes to the least loaded one that can take it now.
  void grantLocked() {
    for (;;) {
      int best = -1;
      for (int d = 0; d < options.numDestinations; ++d) {
        auto& q = queues[static_cast<size_t>(d)];
        while (!q.empty() && (q.front()->granted || q.front()->from->closed)) q.pop_front();
        auto& ds = stats.destinations[static_cast<size_t>(d)];
        ds.queued = q.size();
        if (q.empty()) continue;
        if (ds.load > 0 && ds.load + q.front()->bytes > options.destBytes) continue;
        if (best < 0 || ds.load < stats.destinations[static_cast<size_t>(best)].load) best = d;
      }
      if (best < 0) return;
      const auto d = static_cast<size_t>(best);
      std::shared_ptr<Request> rp = queues[d].front();
      queues[d].pop_front();
      Request& r = *rp;
      r.granted = true;
      r.from->waiting.erase(r.id);
      auto& ds = stats.destinations[d];
      ds.queued = queues[d].size();
      ds.granted++;
      ds.load += r.bytes;
      ds.maxLoad = std::max(ds.maxLoad, ds.load);
      ds.maxGrant = std::max(ds.maxGrant, r.bytes);
      uint64_t delayUs = 0;
      int64_t paceEndNs = 0;
      const uint64_t rate = *options.rateBytesPerSec;  // resolved by create()
      if (rate > 0) {
        const int64_t now = nowNs();
        const int64_t start = std::max(now, nextFreeNs[d]);
        // bytes <= 1 GiB (kMaxRequestBytes): the product fits; the sum saturates instead of
        // overflowing after many large grants at a very low rate.
        const auto busyNs = static_cast<int64_t>(r.bytes * 1000000000ull / rate);
        if (__builtin_add_overflow(start, busyNs, &nextFreeNs[d])) {
          nextFreeNs[d] = std::numeric_limits<int64_t>::max();
        }
        paceEndNs = nextFreeNs[d];
        auto& ends = bookedEnds[d];
        while (!ends.empty() && *ends.begin() <= now) ends.erase(ends.begin());  // over
        ends.insert(paceEndNs);
        delayUs = static_cast<uint64_t>((start - now) / 1000);
      }
      grants[{r.from.get(), r.id}] = Grant{r.from, best, r.bytes, paceEndNs};
      send(r.from, SchedOp::kGrant, r.id, d, delayUs);
    }
  }

  void onClosed(const std::shared_ptr<Conn>& c) {
    std::lock_guard<std::mutex> lock(mu);
    if (c->closed) return;
    c->closed = true;
    conns.erase(std::remove(conns.begin(), conns.end(), c), conns.end());
    for (auto it = grants.begin(); it != grants.end();) {
      if (it->second.to == c) {
        auto& ds = stats.destinations[static_cast<size_t>(it->second.dest)];
        ds.released++;
        ds.load -= it->second.bytes;
        it = grants.erase(it);
      } else {
        ++it;
      }
    }
    if (!stopped) grantLocked();
  }
};

StatusOr<std::unique_ptr<CentralScheduler>> CentralScheduler::create(
    const SchedulerOptions& options) {
  if (options.numDestinations < 1) {
    return InvalidArgument("cofab-sched: numDestinations must be >= 1");
  }
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  if (impl->options.destBytes == 0) {
    COFAB_ASSIGN_OR_RETURN(int64_t v, kSchedDestBytes.get());
    impl->options.destBytes = static_cast<uint64_t>(v);
  }
  if (!impl->options.rateBytesPerSec) {
    COFAB_ASSIGN_OR_RETURN(int64_t v, kSchedRate.get());
    impl->options.rateBytesPerSec = static_cast<uint64_t>(v);
  }
  const auto n = static_cast<size_t>(options.numDestinations);
  impl->queues.resize(n);
  impl->nextFreeNs.assign(n, 0);
  impl->bookedEnds.resize(n);
  impl->stats.destinations.resize(n);
  impl->stats.destBytes = impl->options.destBytes;
  impl->stats.rateBytesPerSec = *impl->options.rateBytesPerSec;
  transport::ContextOptions co;
  co.localId = "cofab-sched";
  COFAB_ASSIGN_OR_RETURN(impl->ctx, transport::Registry::create(options.transport, co));
  transport::ListenOptions lo;
  lo.address = options.listenAddress;
  COFAB_ASSIGN_OR_RETURN(impl->listener, impl->ctx->listen(lo));
  impl->address = impl->listener->address();
  impl->acceptNext();
  return std::unique_ptr<CentralScheduler>(new CentralScheduler(std::move(impl)));
}

CentralScheduler::~CentralScheduler() { shutdown(); }

const std::string& CentralScheduler::address() const { return impl_->address; }

SchedulerStats CentralScheduler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

void CentralScheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->listener->close();
  impl_->ctx->join();  // closes every connection; every callback has run afterwards
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->conns.clear();
  impl_->queues.clear();
  impl_->grants.clear();
}

}  // namespace cofab::transfer
