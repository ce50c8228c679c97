// Loopback fault injection: what the layers above rely on to test their error paths.
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

}  // namespace
}  // namespace cofab::transport::testing
