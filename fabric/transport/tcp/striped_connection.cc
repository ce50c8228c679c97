#include "fabric/transport/tcp/striped_connection.h"

#include "core/check.h"
#include "fabric/transport/tcp/tcp_connection.h"

namespace cofab::transport::tcp {

// Posting order is fixed under postMu (the i-th operation of a direction that uses the stream
// goes to socket i mod N, after the (i-N)-th), completions are released in posting order under
// mu.
struct StripedConnection::State {
  using Fire = std::function<void(const Status&)>;
  struct Sequencer {
    uint64_t nextPost = 0;  // under postMu: operations posted
    uint64_t nextWire = 0;  // under postMu: operations that use the stream (pass the checks)
    uint64_t nextFire = 0;  // under mu
    std::map<uint64_t, std::pair<Status, Fire>> ready;  // under mu
    bool firing = false;                                // under mu: one thread releases at a time
  };

  std::vector<std::shared_ptr<Connection>> subs;
  std::mutex postMu;
  std::mutex mu;
  Sequencer sends;
  Sequencer recvs;
  Status failure;           // under mu: the first socket failure (not the user's close)
  bool userClosed = false;  // under mu

  // Which socket the next operation uses. An operation that fails its checks (bad input) fails
  // alone without touching the stream, so it must not take a turn in the round-robin: the
  // peer's count would drift. It still goes to a socket, which fails it asynchronously.
  Connection& pick(Sequencer& q, bool usesStream) {
    const uint64_t turn = usesStream ? q.nextWire++ : q.nextWire;
    return *subs[turn % subs.size()];
  }

  // A sub-operation finished: record it, then release every operation that is now next in line.
  // `usesStream`: it passed the argument checks, so its failure is the socket's (sticky).
  void completed(Sequencer& q, bool usesStream, uint64_t seq, const Status& own, Fire fire) {
    bool closeOthers = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      // A rejected argument fails its operation only; anything else is the socket's failure.
      if (!own.ok() && failure.ok() && !userClosed && usesStream) {
        failure = own;
        closeOthers = true;
      }
      q.ready.emplace(seq, std::make_pair(own, std::move(fire)));
    }
    // The other sockets' pending operations must not wait for a peer that is gone: closing them
    // cancels them, and the sequencer reports them with the failure instead of Cancelled.
    if (closeOthers) {
      for (auto& s : subs) s->close();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (q.firing) return;
      q.firing = true;
    }
    for (;;) {
      Fire f;
      Status s;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = q.ready.find(q.nextFire);
        if (it == q.ready.end()) {
          q.firing = false;
          return;
        }
        s = failure.ok() ? it->second.first : failure;
        f = std::move(it->second.second);
        q.ready.erase(it);
        ++q.nextFire;
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
