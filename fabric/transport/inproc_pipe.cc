#include "fabric/transport/inproc_pipe.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace cofab::transport {
namespace {

struct SendItem {
  wire::Header header;
  std::vector<ConstSlice> slices;
  size_t bytes = 0;
  SendCallback done;
  Status error;
};

struct RecvItem {
  enum class Kind : uint8_t { kPosted, kOwned, kRouted };
  Kind kind = Kind::kPosted;
  std::vector<MutableSlice> dest;
  size_t expected = 0;
  RecvCallback done;
  RecvOwnedCallback ownedDone;
  RecvRoute route;
  Status error;
};

// Shared by both ends. The pipe thread holds a reference while it runs and exits once both ends
// are closed and nothing is left to complete, so the last owner may be either an end's user or
// the thread itself; the thread is detached for that reason.
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(std::string idA, std::string idB, uint64_t maxPayload) : maxPayload_(maxPayload) {
    side_[0].peerId = std::move(idB);
    side_[1].peerId = std::move(idA);
  }

  void startThread() {
    std::thread([self = shared_from_this()] { self->run(); }).detach();
  }

  void send(int s, const wire::Header& header, ConstSlices payload, SendCallback done) {
    SendItem it;
    it.header = header;
    it.done = std::move(done);
    for (size_t i = 0; i < payload.size(); ++i) {
      if (payload[i].data == nullptr && payload[i].size > 0 && it.error.ok()) {
        it.error = InvalidArgument("send on " + describe(s) + ": slice " + std::to_string(i) +
                                   " has a null pointer and " + std::to_string(payload[i].size) +
                                   " bytes");
      }
      it.slices.push_back(payload[i]);
      it.bytes += payload[i].size;
    }
    it.header.payloadLength = it.bytes;
    if (it.error.ok()) {
      it.error = wire::validateHeader(it.header, wire::DecodeOptions{maxPayload_});
      if (!it.error.ok()) it.error = it.error.withContext("send on " + describe(s));
    }
    std::lock_guard<std::mutex> lock(mu_);
    Side& me = side_[s];
    if (me.closed && it.error.ok()) {
      it.error = FailedPrecondition("send on " + describe(s) + ": the connection is closed");
    }
    me.sends.push_back(std::move(it));
    wakeLocked();
  }

  void recv(int s, RecvItem it) {
    if (it.kind == RecvItem::Kind::kPosted) {
      for (size_t i = 0; i < it.dest.size(); ++i) {
        if (it.dest[i].data == nullptr && it.dest[i].size > 0 && it.error.ok()) {
          it.error = InvalidArgument("recv on " + describe(s) + ": slice " + std::to_string(i) +
                                     " has a null pointer and " + std::to_string(it.dest[i].size) +
                                     " bytes");
        }
        it.expected += it.dest[i].size;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    Side& me = side_[s];
    if (me.closed && it.error.ok()) {
      it.error = FailedPrecondition("recv on " + describe(s) + ": the connection is closed");
    }
    me.recvs.push_back(std::move(it));
    wakeLocked();
  }

  void close(int s) {
    std::lock_guard<std::mutex> lock(mu_);
    Side& me = side_[s];
    if (me.closed) return;
    me.closed = true;
    if (me.error.ok()) me.error = Cancelled(describe(s) + " was closed");
    Side& other = side_[1 - s];
    if (other.error.ok()) {
      other.error = RemoteError(describe(1 - s) + ": the peer '" + side_[1 - s].peerId +
                                "' closed the connection");
    }
    wakeLocked();
  }

  Status status(int s) const {
    std::lock_guard<std::mutex> lock(mu_);
    return side_[s].error;
  }

  void join(int s) {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] {
      const Side& me = side_[s];
      return me.closed && me.sends.empty() && me.recvs.empty() && me.running == 0;
    });
  }

  const std::string& peerId(int s) const { return side_[s].peerId; }
  std::string describe(int s) const { return "in-process connection to '" + side_[s].peerId + "'"; }

 private:
  struct Side {
    std::string peerId;
    std::deque<SendItem> sends;  // sent by this end, for the other end's receives
    std::deque<RecvItem> recvs;  // posted on this end
    bool closed = false;
    Status error;     // sticky: Cancelled (closed here), RemoteError (peer closed), or a size error
    int running = 0;  // callbacks of this end in progress
  };

  void wakeLocked() {
    if (exited_) {
      // Both ends were closed and the thread is gone: complete late operations on a helper.
      exited_ = false;
      startThread();
      return;
    }
    work_.notify_one();
  }

  // The pipe thread: completes failed operations and delivers messages, one at a time, copying
  // with the lock released.
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (step(lock)) continue;
      if (side_[0].closed && side_[1].closed) {
        exited_ = true;
        idle_.notify_all();
        return;
      }
      idle_.notify_all();
      work_.wait(lock);
    }
  }

  static void finishSend(SendItem& it, const Status& s) {
    if (it.done) it.done(s);
  }
  static void finishRecv(RecvItem& it, const Status& s, const wire::Header& h,
                         std::vector<uint8_t>&& payload) {
    if (it.kind == RecvItem::Kind::kPosted) {
      if (it.done) it.done(s, h);
    } else if (it.ownedDone) {
      it.ownedDone(s, h, std::move(payload));
    }
  }

  // Runs one completion or delivery; false when there is nothing to do. Called and returns with
  // `lock` held.
  bool step(std::unique_lock<std::mutex>& lock) {
    for (int s = 0; s < 2; ++s) {
      Side& me = side_[s];
      // Operations that failed on their own, or after this end's error: complete in order.
      if (!me.sends.empty() && (!me.sends.front().error.ok() || !me.error.ok())) {
        SendItem it = std::move(me.sends.front());
        me.sends.pop_front();
        const Status st = it.error.ok() ? me.error : it.error;
        ++me.running;
        lock.unlock();
        finishSend(it, st);
        it = SendItem{};
        lock.lock();
        --me.running;
        return true;
      }
      if (!me.recvs.empty() && (!me.recvs.front().error.ok() || !me.error.ok())) {
        RecvItem it = std::move(me.recvs.front());
        me.recvs.pop_front();
        const Status st = it.error.ok() ? me.error : it.error;
        ++me.running;
        lock.unlock();
        finishRecv(it, st, wire::Header{}, {});
        it = RecvItem{};
        lock.lock();
        --me.running;
        return true;
      }
    }
    for (int s = 0; s < 2; ++s) {
      Side& from = side_[s];
      Side& to = side_[1 - s];
      if (from.sends.empty() || to.recvs.empty() || !from.error.ok() || !to.error.ok()) continue;
      SendItem snd = std::move(from.sends.front());
      from.sends.pop_front();
      RecvItem rcv = std::move(to.recvs.front());
      to.recvs.pop_front();
      ++from.running;
      ++to.running;
      lock.unlock();
      const Status bad = deliver(1 - s, snd, rcv);
      lock.lock();
      if (!bad.ok()) {
        // As a stream transport would: the receiving end fails for good, the sender sees it gone.
        if (to.error.ok()) to.error = bad;
        if (from.error.ok()) {
          from.error = RemoteError(describe(s) + ": the peer '" + from.peerId +
                                   "' dropped the connection: " + bad.message());
        }
      }
      --from.running;
      --to.running;
      return true;
    }
    return false;
  }

  // Copies one message into the receive and runs both callbacks (lock released).
  Status deliver(int toSide, SendItem& snd, RecvItem& rcv) {
    const wire::Header& h = snd.header;
    std::vector<uint8_t> owned;
    std::vector<MutableSlice> dest;
    Status bad;
    if (rcv.kind == RecvItem::Kind::kPosted) {
      dest = rcv.dest;
      if (rcv.expected != snd.bytes) {
        bad = InvalidArgument("recv on " + describe(toSide) + ": message payload is " +
                              std::to_string(snd.bytes) + " bytes but the posted receive expects " +
                              std::to_string(rcv.expected) + " bytes (" + h.describe() + ")");
      }
    } else {
      MutableSlice routed{};
      if (rcv.kind == RecvItem::Kind::kRouted && rcv.route) routed = rcv.route(h);
      if (routed.data != nullptr) {
        if (routed.size != snd.bytes) {
          bad = InvalidArgument("recvRouted on " + describe(toSide) + ": message payload is " +
                                std::to_string(snd.bytes) + " bytes but the route gave " +
                                std::to_string(routed.size) + " bytes (" + h.describe() + ")");
        }
        dest.push_back(routed);
      } else {
        owned.resize(snd.bytes);
        dest.push_back({owned.data(), owned.size(), nullptr});
      }
    }
    if (bad.ok()) {
      // Gather from the sender's slices into the receiver's, one copy per overlapping piece.
      size_t si = 0, so = 0;
      for (const MutableSlice& d : dest) {
        size_t done = 0;
        while (done < d.size && si < snd.slices.size()) {
          const ConstSlice& src = snd.slices[si];
          const size_t n = std::min(d.size - done, src.size - so);
          if (n > 0) {
            std::memcpy(static_cast<uint8_t*>(d.data) + done,
                        static_cast<const uint8_t*>(src.data) + so, n);
          }
          done += n;
          so += n;
          if (so == src.size) {
            ++si;
            so = 0;
          }
        }
      }
    }
    finishSend(snd, OkStatus());
    if (!bad.ok()) {  // sticky already in the failing receive's callback (status(), sends)
      std::lock_guard<std::mutex> lock(mu_);
      if (side_[toSide].error.ok()) side_[toSide].error = bad;
    }
    finishRecv(rcv, bad, h, bad.ok() ? std::move(owned) : std::vector<uint8_t>{});
    snd = SendItem{};
    rcv = RecvItem{};
    return bad;
  }

  const uint64_t maxPayload_;
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable idle_;
  Side side_[2];
  bool exited_ = false;
};

class End final : public PipeEnd {
 public:
  End(std::shared_ptr<Core> core, int side) : core_(std::move(core)), side_(side) {}
  ~End() override { core_->close(side_); }

  void send(const wire::Header& header, ConstSlices payload, SendCallback done) override {
    core_->send(side_, header, payload, std::move(done));
  }
  void recv(MutableSlices dest, RecvCallback done) override {
    RecvItem it;
    it.kind = RecvItem::Kind::kPosted;
    it.dest.assign(dest.begin(), dest.end());
    it.done = std::move(done);
    core_->recv(side_, std::move(it));
  }
  void recvOwned(RecvOwnedCallback done) override {
    RecvItem it;
    it.kind = RecvItem::Kind::kOwned;
    it.ownedDone = std::move(done);
    core_->recv(side_, std::move(it));
  }
  void recvRouted(RecvRoute route, RecvOwnedCallback done) override {
    RecvItem it;
    it.kind = RecvItem::Kind::kRouted;
    it.route = std::move(route);
    it.ownedDone = std::move(done);
    core_->recv(side_, std::move(it));
  }
  void close() override { core_->close(side_); }
  Status status() const override { return core_->status(side_); }
  const std::string& peerId() const override { return core_->peerId(side_); }
  const std::string& peerAddress() const override { return address_; }
  std::string describe() const override { return core_->describe(side_); }
  void join() override { core_->join(side_); }

 private:
  std::shared_ptr<Core> core_;
  const int side_;
  const std::string address_ = "in-process";
};

}  // namespace

PipeEnds makeInProcessPipe(const std::string& idA, const std::string& idB, uint64_t maxPayload) {
  auto core = std::make_shared<Core>(idA, idB, maxPayload);
  core->startThread();
  return PipeEnds{std::make_shared<End>(core, 0), std::make_shared<End>(core, 1)};
}

}  // namespace cofab::transport
