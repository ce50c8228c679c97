// StripedConnection over fake sockets whose completions the test drives, so that the order in
// which the sockets finish (which real sockets on different loops make a race) is chosen here.
#include "fabric/transport/tcp/striped_connection.h"

#include <condition_variable>
#include <deque>
#include <thread>

#include "tests/fabric/transport/transport_test_util.h"

namespace cofab::transport::testing {
namespace {

// One socket of the group. Operations wait until the test completes them, in posting order per
// direction; close() fails what is pending with Cancelled, like a real connection.
class FakeSocket final : public Connection {
 public:
  using Connection::recv;
  using Connection::send;
  void send(const wire::Header&, ConstSlices, SendCallback done) override {
    std::lock_guard<std::mutex> lock(mu_);
    sends_.push_back(std::move(done));
  }
  void recv(MutableSlices, RecvCallback done) override {
    std::lock_guard<std::mutex> lock(mu_);
    recvs_.push_back(std::move(done));
  }
  void recvOwned(RecvOwnedCallback done) override {
    recv(MutableSlices{}, [done = std::move(done)](const Status& s, const wire::Header& h) {
      done(s, h, {});
    });
  }
  void close() override {
    std::deque<SendCallback> sends;
    std::deque<RecvCallback> recvs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      sends.swap(sends_);
      recvs.swap(recvs_);
    }
    for (auto& d : sends) d(Cancelled("fake socket closed"));
    for (auto& d : recvs) d(Cancelled("fake socket closed"), wire::Header{});
  }
  Status status() const override { return OkStatus(); }
  const std::string& peerId() const override { return id_; }
  const std::string& peerAddress() const override { return id_; }
  std::string describe() const override { return "fake"; }

  // Test side: completes the oldest pending operation; false when none is pending.
  bool completeSend(const Status& s) {
    SendCallback d;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (sends_.empty()) return false;
      d = std::move(sends_.front());
      sends_.pop_front();
    }
    d(s);
    return true;
  }
  bool completeRecv(const Status& s) {
    RecvCallback d;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (recvs_.empty()) return false;
      d = std::move(recvs_.front());
      recvs_.pop_front();
    }
    d(s, wire::Header{});
    return true;
  }
  size_t pendingRecvs() {
    std::lock_guard<std::mutex> lock(mu_);
    return recvs_.size();
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

 private:
  const std::string id_ = "fake";
  std::mutex mu_;
  std::deque<SendCallback> sends_;
  std::deque<RecvCallback> recvs_;
  bool closed_ = false;
};

struct Group {
  std::shared_ptr<FakeSocket> a = std::make_shared<FakeSocket>();
  std::shared_ptr<FakeSocket> b = std::make_shared<FakeSocket>();
  std::unique_ptr<tcp::StripedConnection> conn =
      std::make_unique<tcp::StripedConnection>(std::vector<std::shared_ptr<Connection>>{a, b});
};

// The peer sent m0, m1, m2 and closed. Socket b (m1, then end of stream) happens to notice the
// close before socket a has read m0 and m2: those were sent, so they must still be delivered, as
// on a single socket; the failure takes effect at its place in the stream (receive 3). It then
// also fails the other direction's pending send, so the connection is not left half-alive.
TEST(StripedConnectionTest, APeerCloseSeenFirstOnOneSocketKeepsWhatWasSentBeforeIt) {
  Group g;
  Recorder recvs, sends;
  uint8_t buf[8] = {};  // the fake sockets do not touch it
  for (size_t i = 0; i < 4; ++i) g.conn->recv(buf, sizeof(buf), recvs.recvCb(i));  // a b a b
  g.conn->send(wire::Header{}, buf, sizeof(buf), sends.sendCb());                  // a
  ASSERT_TRUE(g.b->completeRecv(OkStatus()));                                // m1
  ASSERT_TRUE(g.b->completeRecv(RemoteError("peer closed the connection")));
  EXPECT_EQ(recvs.count(), 0u) << "receive 0 (m0) is still outstanding and comes first";
  EXPECT_FALSE(g.a->closed()) << "closing socket a would discard m0 and m2, which were sent";
  ASSERT_EQ(g.a->pendingRecvs(), 2u);
  ASSERT_TRUE(g.a->completeRecv(OkStatus()));  // m0
  ASSERT_TRUE(g.a->completeRecv(OkStatus()));  // m2
  ASSERT_TRUE(recvs.wait(4));
  const auto st = recvs.statuses();
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_TRUE(st[1].ok()) << st[1];
  EXPECT_TRUE(st[2].ok()) << st[2];
  EXPECT_EQ(st[3].code(), StatusCode::kRemoteError) << st[3];
  // The failure closed the other socket: the pending send fails with it, not Cancelled.
  EXPECT_TRUE(g.a->closed());
  ASSERT_TRUE(sends.wait(1));
  EXPECT_EQ(sends.statuses()[0].code(), StatusCode::kRemoteError) << sends.statuses()[0];
  EXPECT_EQ(g.conn->status().code(), StatusCode::kRemoteError);
}

// The sockets complete on different loop threads. One connection's callbacks never run two at
// once, whichever direction they belong to: a send completing while a receive callback runs
// waits for it and is released by the thread running it.
TEST(StripedConnectionTest, CallbacksOfBothDirectionsNeverRunAtOnce) {
  Group g;
  uint8_t buf[8] = {};
  std::mutex mu;
  std::condition_variable cv;
  bool inRecv = false, sendCompleted = false;
  std::atomic<bool> sendRan{false}, sendRanDuringRecv{false};
  g.conn->recv(buf, sizeof(buf), [&](const Status&, const wire::Header&) {
    std::unique_lock<std::mutex> lock(mu);
    inRecv = true;
    cv.notify_all();
    // Bounded: with the bug the send's callback has already run on the other thread.
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return sendCompleted; });
    sendRanDuringRecv = sendRan.load();
  });
  g.conn->send(wire::Header{}, buf, sizeof(buf), [&](const Status&) { sendRan = true; });
  std::thread loopA([&] { ASSERT_TRUE(g.a->completeRecv(OkStatus())); });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return inRecv; }));
  }
  ASSERT_TRUE(g.a->completeSend(OkStatus()));  // "loop B"
  {
    std::lock_guard<std::mutex> lock(mu);
    sendCompleted = true;
    cv.notify_all();
  }
  loopA.join();
  EXPECT_FALSE(sendRanDuringRecv) << "the send callback ran while the receive callback ran";
  EXPECT_TRUE(sendRan) << "the thread releasing callbacks must release the queued send too";
}

}  // namespace
}  // namespace cofab::transport::testing
