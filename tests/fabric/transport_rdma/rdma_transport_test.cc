// rdma-specific transport tests over the verbs emulation (tests/support/verbs_emulation.h):
// credit flow control with tiny slot rings, QP errors reported as RemoteError with the verbs
// status string, memory registration and the registration cache. The generic contract suite
// runs over the emulation in rdma_contract_tests.
#include <gtest/gtest.h>

#include "fabric/transport/rdma/factory.h"
#include "fabric/transport/rdma/rdma_memory_region.h"
#include "tests/fabric/transport/transport_test_util.h"
#include "tests/support/verbs_emulation.h"

namespace cofab::transport::testing {
namespace {

class RdmaTransportTest : public ::testing::Test {
 protected:
  void start(int slots, int slotBytes) {
    cofab::testing::setEmulatedDeviceCount(1);
    const rdma::RdmaOptions o{.verbs = &cofab::testing::emulatedVerbs(),
                              .slots = slots,
                              .slotBytes = slotBytes};
    auto s = rdma::createContext({.localId = "server"}, o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *s;
    auto c = rdma::createContext({.localId = "client"}, o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *c;
    auto l = server_->listen({});
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(l).value();
    auto conn = client_->connect(listener_->address(), {.localId = "rank 1"}, testDeadline());
    ASSERT_TRUE(conn.ok()) << conn.status();
    p_.client = *conn;
    auto a = listener_->accept(testDeadline());
    ASSERT_TRUE(a.ok()) << a.status();
    p_.server = *a;
  }
  void TearDown() override {
    cofab::testing::setEmulatedRkeyFault(false);
    listener_.reset();
    if (client_) client_->join();
    if (server_) server_->join();
  }

  std::shared_ptr<Context> server_, client_;
  std::unique_ptr<Listener> listener_;
  ConnPair p_;
};

TEST_F(RdmaTransportTest, TwoSlotRingCarriesManyMessagesLargerThanTheRing) {
  start(/*slots=*/2, /*slotBytes=*/4096);
  const size_t kMsgs = 50;
  std::vector<std::vector<uint8_t>> src, dst;
  for (size_t i = 0; i < kMsgs; ++i) {
    src.push_back(pattern(i * 997 + (i % 3 == 0 ? 20000 : 1), static_cast<uint32_t>(i)));
    dst.emplace_back(src.back().size());
  }
  Recorder sent, got;
  for (size_t i = 0; i < kMsgs; ++i) p_.server->recv(dst[i].data(), dst[i].size(), got.recvCb(i));
  for (size_t i = 0; i < kMsgs; ++i) {
    wire::Header h;
    h.sequence = i;
    p_.client->send(h, src[i].data(), src[i].size(), sent.sendCb(i));
  }
  ASSERT_TRUE(sent.wait(kMsgs));
  ASSERT_TRUE(got.wait(kMsgs));
  for (size_t i = 0; i < kMsgs; ++i) {
    ASSERT_TRUE(got.statuses()[i].ok()) << got.statuses()[i];
    ASSERT_EQ(got.headers()[i].sequence, i);
    ASSERT_TRUE(src[i] == dst[i]) << i;
  }
}

TEST_F(RdmaTransportTest, SenderWaitsForCreditsUntilTheReceiverPostsReceives) {
  start(/*slots=*/2, /*slotBytes=*/4096);
  // 5 one-chunk messages but only 2 slots: 3 sends cannot complete before receives are posted.
  std::vector<uint64_t> out(5), in(5);
  Recorder sent, got;
  for (size_t i = 0; i < 5; ++i) {
    out[i] = i + 100;
    p_.client->send(wire::Header{}, &out[i], sizeof(uint64_t), sent.sendCb(i));
  }
  ASSERT_TRUE(sent.wait(2));
  EXPECT_FALSE(sent.wait(3, std::chrono::milliseconds(200)))
      << "a send completed without a free receive slot";
  for (size_t i = 0; i < 5; ++i) p_.server->recv(&in[i], sizeof(uint64_t), got.recvCb(i));
  ASSERT_TRUE(sent.wait(5));
  ASSERT_TRUE(got.wait(5));
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(in[i], i + 100);
}

TEST_F(RdmaTransportTest, QpErrorFailsPendingOperationsWithTheVerbsStatusString) {
  start(8, 4096);
  std::vector<uint8_t> buf(100);
  Recorder peer;
  p_.server->recv(buf.data(), buf.size(), peer.recvCb());
  cofab::testing::setEmulatedRkeyFault(true);
  Recorder sent;
  p_.client->send(wire::Header{}, buf.data(), buf.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  const Status s = sent.statuses()[0];
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s;
  EXPECT_NE(s.message().find("remote access error"), std::string::npos) << s;
  EXPECT_NE(s.message().find("server"), std::string::npos) << s;
  EXPECT_EQ(p_.client->status().code(), StatusCode::kRemoteError);
  // Sticky, and the peer learns through the side channel.
  Recorder later;
  p_.client->send(wire::Header{}, buf.data(), buf.size(), later.sendCb());
  ASSERT_TRUE(later.wait(1));
  EXPECT_EQ(later.statuses()[0], s);
  ASSERT_TRUE(peer.wait(1));
  EXPECT_EQ(peer.statuses()[0].code(), StatusCode::kRemoteError) << peer.statuses()[0];
  EXPECT_NE(peer.statuses()[0].message().find("rank 1"), std::string::npos)
      << peer.statuses()[0];
}

TEST_F(RdmaTransportTest, RegisteredMemoryAndTheRegistrationCache) {
  start(4, 4096);
  std::vector<uint8_t> buf(1 << 16);
  auto mr = client_->registerMemory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok()) << mr.status();
  auto* rmr = dynamic_cast<rdma::RdmaMemoryRegion*>(mr->get());
  ASSERT_NE(rmr, nullptr);
  EXPECT_NE(rmr->lkey(), 0u);

  auto dev = rdma::RdmaDevice::open(cofab::testing::emulatedVerbs(), {});
  ASSERT_TRUE(dev.ok()) << dev.status();
  rdma::RegistrationCache cache(*dev, 2);
  std::vector<uint8_t> a(4096), b(4096), c(4096);
  auto r1 = cache.get(a.data(), a.size());
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = cache.get(a.data() + 100, 200);  // inside the first registration
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r1->get(), r2->get());
  EXPECT_EQ(cache.hits(), 1u);
  ASSERT_TRUE(cache.get(b.data(), b.size()).ok());
  ASSERT_TRUE(cache.get(c.data(), c.size()).ok());
  EXPECT_EQ(cache.size(), 2u);  // the least recently used (a) was evicted
  EXPECT_EQ((*r1)->lkey(), (*r2)->lkey());  // still valid while held
  EXPECT_EQ(cache.get(nullptr, 5).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cofab::transport::testing
