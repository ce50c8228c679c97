// Loopback fault injection: what the layers above rely on to test their error paths.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "fabric/transport/loopback/factory.h"
#include "tests/fabric/transport/transport_test_util.h"

namespace cofab::transport::testing {
namespace {

class LoopbackFaultsTest : public ::testing::Test {
 protected:
  void start(const loopback::FaultPlan& clientFaults) {
    auto s = loopback::createContext({.localId = "server"});
    ASSERT_TRUE(s.ok());
    server_ = *s;
    auto c = loopback::createContext({.localId = "client"}, {.faults = clientFaults});
    ASSERT_TRUE(c.ok());
    client_ = *c;
    auto l = server_->listen({});
    ASSERT_TRUE(l.ok()) << l.status();
    auto cc = client_->connect((*l)->address(), {.localId = "client"}, testDeadline());
    ASSERT_TRUE(cc.ok()) << cc.status();
    auto a = (*l)->accept(testDeadline());
    ASSERT_TRUE(a.ok()) << a.status();
    p_ = {*cc, *a};
  }
  void TearDown() override {
    p_ = {};
    if (client_) client_->join();
    if (server_) server_->join();
  }

  std::shared_ptr<Context> server_;
  std::shared_ptr<Context> client_;
  ConnPair p_;
};

TEST_F(LoopbackFaultsTest, CorruptHeaderByteIsDataLoss) {
  start({.corruptByteAt = 30});  // inside the first header
  const auto src = pattern(100, 1);
  std::vector<uint8_t> dst(100);
  Recorder rec;
  p_.server->recv(dst.data(), dst.size(), rec.recvCb());
  p_.client->send(wire::Header{}, src.data(), src.size(), [](const Status&) {});
  ASSERT_TRUE(rec.wait(1));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kDataLoss) << rec.statuses()[0];
  EXPECT_NE(rec.statuses()[0].message().find("CRC"), std::string::npos);
}

TEST_F(LoopbackFaultsTest, CorruptPayloadByteIsCaughtByThePayloadChecksum) {
  start({.corruptByteAt = 64 + 10});  // payload byte 10 of the first message
  const auto src = pattern(100, 1);
  std::vector<uint8_t> dst(100);
  Recorder rec;
  wire::Header h;
  h.flags = wire::kFlagPayloadCrc;
  p_.server->recv(dst.data(), dst.size(), rec.recvCb());
  p_.client->send(h, src.data(), src.size(), [](const Status&) {});
  ASSERT_TRUE(rec.wait(1));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kDataLoss) << rec.statuses()[0];
}

TEST_F(LoopbackFaultsTest, CorruptPayloadWithoutChecksumArrivesCorrupted) {
  start({.corruptByteAt = 64 + 10});
  const auto src = pattern(100, 1);
  std::vector<uint8_t> dst(100);
  Recorder rec;
  p_.server->recv(dst.data(), dst.size(), rec.recvCb());
  p_.client->send(wire::Header{}, src.data(), src.size(), [](const Status&) {});
  ASSERT_TRUE(rec.wait(1));
  ASSERT_TRUE(rec.statuses()[0].ok());
  EXPECT_EQ(dst[10], static_cast<uint8_t>(src[10] ^ 0xFF));
  dst[10] = src[10];
  EXPECT_TRUE(dst == src);
}

TEST_F(LoopbackFaultsTest, DropAfterBytesBreaksBothEnds) {
  start({.dropAfterBytes = 64 + 100 + 64 + 50});  // first message whole, second cut
  const auto src = pattern(100, 1);
  std::vector<uint8_t> a(100);
  std::vector<uint8_t> b(100);
  Recorder got;
  Recorder sent;
  p_.server->recv(a.data(), a.size(), got.recvCb());
  p_.server->recv(b.data(), b.size(), got.recvCb());
  p_.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  p_.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(got.wait(2));
  ASSERT_TRUE(sent.wait(2));
  EXPECT_TRUE(got.statuses()[0].ok()) << got.statuses()[0];
  EXPECT_TRUE(a == src);
  EXPECT_EQ(got.statuses()[1].code(), StatusCode::kRemoteError) << got.statuses()[1];
  EXPECT_TRUE(sent.statuses()[0].ok());
  EXPECT_EQ(sent.statuses()[1].code(), StatusCode::kRemoteError) << sent.statuses()[1];
  EXPECT_EQ(p_.client->status().code(), StatusCode::kRemoteError);
}

TEST_F(LoopbackFaultsTest, DelayHoldsEachMessageBack) {
  start({.delay = std::chrono::milliseconds(100)});
  uint32_t v = 5;
  uint32_t out = 0;
  Recorder rec;
  const auto t0 = Clock::now();
  p_.server->recv(&out, sizeof(out), rec.recvCb());
  p_.client->send(wire::Header{}, &v, sizeof(v), [](const Status&) {});
  ASSERT_TRUE(rec.wait(1));
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(95));
  EXPECT_EQ(out, 5u);
}

TEST_F(LoopbackFaultsTest, InjectFaultsOnOneConnection) {
  start({});
  ASSERT_TRUE(loopback::injectFaults(*p_.client, {.corruptByteAt = 0}).ok());
  uint32_t v = 5;
  uint32_t out = 0;
  Recorder rec;
  p_.server->recv(&out, sizeof(out), rec.recvCb());
  p_.client->send(wire::Header{}, &v, sizeof(v), [](const Status&) {});
  ASSERT_TRUE(rec.wait(1));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kDataLoss) << rec.statuses()[0];
  EXPECT_NE(rec.statuses()[0].message().find("magic"), std::string::npos);
}

// Dropping a connection object right after posting a receive: the pump that close() posts keeps
// the end alive, so the receive still completes exactly once and the peer sees the close.
TEST_F(LoopbackFaultsTest, DroppedConnectionCompletesItsPendingOperationsOnce) {
  start({});
  std::vector<uint8_t> serverBuf(100);
  std::vector<uint8_t> clientBuf(100);
  Recorder serverRec;
  Recorder clientRec;
  p_.client->recv(clientBuf.data(), clientBuf.size(), clientRec.recvCb());
  p_.server->recv(serverBuf.data(), serverBuf.size(), serverRec.recvCb());
  p_.server.reset();
  server_->join();  // every callback of the server's context has run when it returns
  ASSERT_EQ(serverRec.count(), 1u) << "the dropped end's receive was destroyed without running";
  EXPECT_FALSE(serverRec.statuses()[0].ok());
  EXPECT_EQ(serverRec.statuses()[0].code(), StatusCode::kCancelled) << serverRec.statuses()[0];
  ASSERT_TRUE(clientRec.wait(1, std::chrono::seconds(10))) << "the peer never saw the close";
  EXPECT_EQ(clientRec.statuses()[0].code(), StatusCode::kRemoteError) << clientRec.statuses()[0];
  EXPECT_EQ(clientRec.count(), 1u);
}

// A listener closed with a connection still in its accept queue discards that connection: the
// client must see it closed rather than wait forever.
TEST_F(LoopbackFaultsTest, ClosingAListenerBreaksItsUnacceptedConnections) {
  auto s = loopback::createContext({.localId = "server"});
  ASSERT_TRUE(s.ok());
  server_ = *s;
  auto c = loopback::createContext({.localId = "client"});
  ASSERT_TRUE(c.ok());
  client_ = *c;
  auto l = server_->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  auto cc = client_->connect((*l)->address(), {.localId = "client"}, testDeadline());
  ASSERT_TRUE(cc.ok()) << cc.status();
  p_.client = *cc;
  std::vector<uint8_t> buf(100);
  Recorder rec;
  p_.client->recv(buf.data(), buf.size(), rec.recvCb());
  (*l)->close();  // never accepted
  ASSERT_TRUE(rec.wait(1, std::chrono::seconds(10))) << "the client's receive hangs";
  const Status got = rec.statuses()[0];
  EXPECT_EQ(got.code(), StatusCode::kRemoteError) << got;
  EXPECT_NE(got.message().find("server"), std::string::npos) << got;
  EXPECT_EQ(p_.client->status().code(), StatusCode::kRemoteError) << p_.client->status();
}

// A plan whose cut lies before the bytes already sent cuts the next send at once (it used to
// size a vector with a negative length and throw on the worker thread).
TEST_F(LoopbackFaultsTest, DropAfterBytesAlreadyPassedCutsAtOnce) {
  start({});
  const auto src = pattern(100, 1);
  std::vector<uint8_t> dst(100);
  Recorder first;
  p_.server->recv(dst.data(), dst.size(), first.recvCb());
  p_.client->send(wire::Header{}, src.data(), src.size(), first.sendCb());
  ASSERT_TRUE(first.wait(2));
  for (const auto& st : first.statuses()) {
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE(dst == src);
  // 64 + 100 bytes are already out.
  ASSERT_TRUE(loopback::injectFaults(*p_.client, {.dropAfterBytes = 10}).ok());
  Recorder got;
  Recorder sent;
  p_.server->recv(dst.data(), dst.size(), got.recvCb());
  p_.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(1, std::chrono::seconds(10)));
  ASSERT_TRUE(got.wait(1, std::chrono::seconds(10)));
  EXPECT_EQ(sent.statuses()[0].code(), StatusCode::kRemoteError) << sent.statuses()[0];
  EXPECT_EQ(got.statuses()[0].code(), StatusCode::kRemoteError) << got.statuses()[0];
  EXPECT_EQ(p_.client->status().code(), StatusCode::kRemoteError) << p_.client->status();
  EXPECT_EQ(p_.server->status().code(), StatusCode::kRemoteError) << p_.server->status();
}

// Two sends that reach one pump after the peer end is gone complete in posting order.
TEST_F(LoopbackFaultsTest, SendsToAGonePeerCompleteInPostingOrder) {
  // Both ends on one context: one worker runs every step below, in a fixed order.
  auto ctx = loopback::createContext({.localId = "both"});
  ASSERT_TRUE(ctx.ok());
  server_ = *ctx;
  auto l = server_->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  {
    auto cc = server_->connect((*l)->address(), {.localId = "client"}, testDeadline());
    ASSERT_TRUE(cc.ok()) << cc.status();
    auto a = (*l)->accept(testDeadline());
    ASSERT_TRUE(a.ok()) << a.status();
    p_ = {*cc, *a};
  }  // p_.server is now the only owner of the server end's connection
  Connection* client = p_.client.get();
  const uint32_t v = 9;
  uint32_t in1 = 0;
  uint32_t in2 = 0;
  Recorder first;
  Recorder cancelled;
  Recorder sent;
  Recorder trigger;
  // 1. The client's message completes this receive; its callback, on the worker, drops the
  //    server's connection object, so the close's pump task is the server end's last owner.
  p_.server->recv(&in1, sizeof(in1), [&](const Status& s, const wire::Header& h) {
    first.record(s, h);
    p_.server.reset();
  });
  // 2. That pump cancels this receive and hands the client an EOF, which queues the client's
  //    pump behind it; this callback then posts two sends. The server end is destroyed when the
  //    close's task ends, so the client's pump finds both sends and no peer.
  p_.server->recv(&in2, sizeof(in2), [&, client](const Status& s, const wire::Header& h) {
    cancelled.record(s, h);
    client->send(wire::Header{}, &v, sizeof(v), sent.sendCb(1));
    client->send(wire::Header{}, &v, sizeof(v), sent.sendCb(2));
  });
  p_.client->send(wire::Header{}, &v, sizeof(v), trigger.sendCb());
  ASSERT_TRUE(first.wait(1, std::chrono::seconds(10)));
  ASSERT_TRUE(cancelled.wait(1, std::chrono::seconds(10)));
  ASSERT_TRUE(sent.wait(2, std::chrono::seconds(10)));
  ASSERT_TRUE(trigger.wait(1, std::chrono::seconds(10)));
  EXPECT_TRUE(first.statuses()[0].ok()) << first.statuses()[0];
  EXPECT_EQ(in1, v);
  EXPECT_EQ(cancelled.statuses()[0].code(), StatusCode::kCancelled) << cancelled.statuses()[0];
  EXPECT_EQ(sent.order(), (std::vector<size_t>{1, 2}));
  for (const auto& st : sent.statuses()) {
    EXPECT_EQ(st.code(), StatusCode::kRemoteError) << st;
  }
}

// A connection that only sends learns that the peer closed: status() and later sends report it.
TEST_F(LoopbackFaultsTest, PeerCloseFailsASendOnlyConnection) {
  start({});
  p_.server->close();  // the server's connection object stays alive
  const uint32_t v = 7;
  Recorder sent;
  bool failed = false;
  for (size_t i = 0; i < 1000 && !failed; ++i) {
    p_.client->send(wire::Header{}, &v, sizeof(v), sent.sendCb(i));
    ASSERT_TRUE(sent.wait(i + 1, std::chrono::seconds(10)));
    failed = !sent.statuses().back().ok();
  }
  ASSERT_TRUE(failed) << "1000 sends succeeded after the peer closed";
  const Status last = sent.statuses().back();
  EXPECT_EQ(last.code(), StatusCode::kRemoteError) << last;
  EXPECT_NE(last.message().find("server"), std::string::npos) << last;
  EXPECT_EQ(p_.client->status().code(), StatusCode::kRemoteError) << p_.client->status();
}

}  // namespace
}  // namespace cofab::transport::testing
