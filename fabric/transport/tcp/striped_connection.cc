#include "fabric/transport/tcp/striped_connection.h"

#include "core/check.h"
#include "fabric/transport/tcp/tcp_connection.h"

namespace cofab::transport::tcp {

// Posting order is fixed under postMu (the i-th operation of a direction that uses the stream
// goes to socket i mod N, after the (i-N)-th), completions are released in posting order under
// mu.
struct StripedConnection::State {
  using Fire = std::function<void(const Status&)>;
  struct Done {
    Status own;
    bool usesStream = false;  // passed the argument checks: its failure is the socket's
    Fire fire;
  };
  struct Sequencer {
    uint64_t nextPost = 0;  // under postMu: operations posted
    uint64_t nextWire = 0;  // under postMu: operations that use the stream (pass the checks)
    uint64_t nextFire = 0;  // under mu
    std::map<uint64_t, Done> ready;  // under mu
  };

  std::vector<std::shared_ptr<Connection>> subs;
  std::mutex postMu;
  std::mutex mu;
  Sequencer sends;
  Sequencer recvs;
  Status failure;           // under mu: the first socket failure (not the user's close)
  bool userClosed = false;  // under mu
  // Under mu: one thread releases callbacks at a time, for both directions together. The
  // connection's callbacks never run two at once (the Connection contract), although the
  // sockets complete on different loop threads, and a failure released in one direction is
  // seen by the other direction's next release.
  bool firing = false;

  // Which socket the next operation uses. An operation that fails its checks (bad input) fails
  // alone without touching the stream, so it must not take a turn in the round-robin: the
  // peer's count would drift. It still goes to a socket, which fails it asynchronously.
  Connection& pick(Sequencer& q, bool usesStream) {
    const uint64_t turn = usesStream ? q.nextWire++ : q.nextWire;
    return *subs[turn % subs.size()];
  }

  // A sub-operation finished: record it, then release every operation that is now next in line.
  void completed(Sequencer& q, bool usesStream, uint64_t seq, const Status& own, Fire fire) {
    {
      std::lock_guard<std::mutex> lock(mu);
      q.ready.emplace(seq, Done{own, usesStream, std::move(fire)});
      if (firing) return;  // the releasing thread picks it up
      firing = true;
    }
    release();
  }

  void release() {
    for (;;) {
      Fire f;
      Status s;
      bool closeAll = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        Sequencer* q = &sends;
        auto it = sends.ready.find(sends.nextFire);
        if (it == sends.ready.end()) {
          q = &recvs;
          it = recvs.ready.find(recvs.nextFire);
          if (it == recvs.ready.end()) {
            firing = false;
            return;
          }
        }
        Done& d = it->second;
        // A socket's failure takes effect at its place in the stream, not when its socket
        // noticed it: a peer that sent m0..m2 and closed is seen by socket 1 (m1, then the end)
        // possibly before socket 0 has read m0 and m2. Everything posted before the failing
        // operation has been released with its own outcome by now, so those messages were
        // delivered; only now are the other sockets closed, failing what remains pending.
        if (!d.own.ok() && d.usesStream && failure.ok() && !userClosed) {
          failure = d.own;
          closeAll = true;
        }
        s = failure.ok() ? d.own : failure;
        f = std::move(d.fire);
        q->ready.erase(it);
        ++q->nextFire;
      }
      // Their pending operations (both directions) complete Cancelled; released after this
      // one, they report the failure instead.
      if (closeAll) {
        for (auto& sub : subs) sub->close();
      }
      f(s);
    }
  }
};

StripedConnection::StripedConnection(std::vector<std::shared_ptr<Connection>> subs)
    : state_(std::make_shared<State>()),
      peerId_(subs.at(0)->peerId()),
      peerAddress_(subs.at(0)->peerAddress()) {
  COFAB_CHECK(subs.size() >= 2);
  state_->subs = std::move(subs);
}

StripedConnection::~StripedConnection() { close(); }

void StripedConnection::send(const wire::Header& header, ConstSlices payload, SendCallback done) {
  const bool ok = checkSendable(header, payload).ok();
  std::lock_guard<std::mutex> lock(state_->postMu);
  const uint64_t seq = state_->sends.nextPost++;
  Connection& sub = state_->pick(state_->sends, ok);
  sub.send(header, payload,
           [st = state_, ok, seq, done = std::move(done)](const Status& s) mutable {
             st->completed(st->sends, ok, seq, s, std::move(done));
           });
}

void StripedConnection::recv(MutableSlices dest, RecvCallback done) {
  const bool ok = checkReceivable(dest).ok();
  std::lock_guard<std::mutex> lock(state_->postMu);
  const uint64_t seq = state_->recvs.nextPost++;
  Connection& sub = state_->pick(state_->recvs, ok);
  sub.recv(dest, [st = state_, ok, seq, done = std::move(done)](const Status& s,
                                                                const wire::Header& h) mutable {
    st->completed(st->recvs, ok, seq, s,
                  [done = std::move(done), h](const Status& final) { done(final, h); });
  });
}

void StripedConnection::recvOwned(RecvOwnedCallback done) {
  std::lock_guard<std::mutex> lock(state_->postMu);
  const uint64_t seq = state_->recvs.nextPost++;
  const bool ok = true;  // a receive into a buffer of its own never fails its checks
  Connection& sub = state_->pick(state_->recvs, ok);
  sub.recvOwned([st = state_, ok, seq, done = std::move(done)](
                    const Status& s, const wire::Header& h, std::vector<uint8_t>&& p) mutable {
    auto payload = std::make_shared<std::vector<uint8_t>>(std::move(p));
    st->completed(st->recvs, ok, seq, s, [done = std::move(done), h, payload](const Status& final) {
      done(final, h, final.ok() ? std::move(*payload) : std::vector<uint8_t>{});
    });
  });
}

void StripedConnection::close() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->userClosed = true;
  }
  for (auto& s : state_->subs) s->close();
}

Status StripedConnection::status() const {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->failure.ok()) return state_->failure;
  }
  for (auto& s : state_->subs) {
    Status st = s->status();
    if (!st.ok()) return st;
  }
  return OkStatus();
}

std::string StripedConnection::describe() const {
  return state_->subs[0]->describe() + " over " + std::to_string(state_->subs.size()) + " sockets";
}

size_t StripedConnection::sockets() const { return state_->subs.size(); }

}  // namespace cofab::transport::tcp
