// rdma-specific transport tests over the verbs emulation (tests/support/verbs_emulation.h):
// credit flow control with tiny slot rings, QP errors reported as RemoteError with the verbs
// status string, closing (or being closed) while chunks are in flight, callback order with
// operations that fail validation, memory registration and the registration cache. The generic
// contract suite runs over the emulation in rdma_contract_tests.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "fabric/transport/rdma/factory.h"
#include "fabric/transport/rdma/rdma_memory_region.h"
#include "tests/fabric/transport/transport_test_util.h"
#include "tests/support/verbs_emulation.h"

namespace cofab::transport::testing {
namespace {

class RdmaTransportTest : public ::testing::Test {
 protected:
  // oneContext: both ends live in server_ (client_ stays null), so one worker thread runs both
  // endpoints and operations posted from a callback on either end run back to back, before
  // either end polls its completion queue again.
  void start(int slots, int slotBytes, bool oneContext = false) {
    cofab::testing::setEmulatedDeviceCount(1);
    const rdma::RdmaOptions o{
        .verbs = &cofab::testing::emulatedVerbs(), .slots = slots, .slotBytes = slotBytes};
    auto s = rdma::createContext({.localId = "server"}, o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *s;
    if (!oneContext) {
      auto c = rdma::createContext({.localId = "client"}, o);
      ASSERT_TRUE(c.ok()) << c.status();
      client_ = *c;
    }
    auto l = server_->listen({});
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(l).value();
    Context& connector = oneContext ? *server_ : *client_;
    auto conn = connector.connect(listener_->address(), {.localId = "rank 1"}, testDeadline());
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
  EXPECT_NE(peer.statuses()[0].message().find("rank 1"), std::string::npos) << peer.statuses()[0];
}

// A send whose chunks are in flight when close() fails it: the QP stays in RTS until the goodbye
// completed, so the chunks' WRITEs still complete afterwards, and they must not reach the failed
// (destroyed) send. The warm-up send's callback runs inside the worker's poll(), so the big send
// and the close run back to back before the next poll: at least one chunk is in flight at the
// close (under ASan this was a heap-use-after-free).
TEST_F(RdmaTransportTest, CloseWithChunksInFlightCompletesTheSendOnceWithCancelled) {
  start(/*slots=*/2, /*slotBytes=*/4096);
  std::vector<uint8_t> warm(8, 1);
  std::vector<uint8_t> big(3 * 4096, 2);  // 4 chunks; the server posts no receive: 2 credits
  Recorder sent;
  std::shared_ptr<Connection> client = p_.client;
  client->send(wire::Header{}, warm.data(), warm.size(), [&sent, &big, client](const Status& s) {
    sent.record(s, {}, 0);
    client->send(wire::Header{}, big.data(), big.size(), sent.sendCb(1));
    client->close();
  });
  ASSERT_TRUE(sent.wait(2));
  // Joining the client's context waits for its endpoint to finish: after the goodbye completed,
  // hence after every WRITE completion posted before it was polled.
  client_->join();
  const auto statuses = sent.statuses();
  ASSERT_EQ(statuses.size(), 2u) << "a send completed twice";
  EXPECT_EQ(sent.order(), (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_EQ(statuses[1].code(), StatusCode::kCancelled) << statuses[1];
  EXPECT_EQ(sent.inlineCalls(), 0);
}

// The same with the peer's goodbye: it arrives (first in the completion queue) while chunks of a
// send are in flight; the send fails with the close, and the WRITE completions that follow must
// not reach it. Both ends share one worker, so the server's close (goodbye posted) and the
// client's send (chunks posted behind it) run back to back before either end polls.
TEST_F(RdmaTransportTest, PeerGoodbyeWithChunksInFlightCompletesTheSendOnce) {
  start(/*slots=*/4, /*slotBytes=*/4096, /*oneContext=*/true);
  std::vector<uint8_t> warm(8, 1);
  std::vector<uint8_t> big(3 * 4096, 2);  // 4 chunks, 3 credits left after the warm-up
  Recorder sent;
  std::shared_ptr<Connection> client = p_.client;
  std::shared_ptr<Connection> server = p_.server;
  client->send(wire::Header{}, warm.data(), warm.size(),
               [&sent, &big, client, server](const Status& s) {
                 sent.record(s, {}, 0);
                 server->close();
                 client->send(wire::Header{}, big.data(), big.size(), sent.sendCb(1));
               });
  ASSERT_TRUE(sent.wait(2));
  client->close();
  server_->join();  // both endpoints finished: every completion has been polled
  const auto statuses = sent.statuses();
  ASSERT_EQ(statuses.size(), 2u) << "a send completed twice";
  EXPECT_EQ(sent.order(), (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_EQ(statuses[1].code(), StatusCode::kRemoteError) << statuses[1];
  EXPECT_NE(statuses[1].message().find("closed the connection"), std::string::npos) << statuses[1];
}

// Messages that arrived before the peer's goodbye stay readable after its QP is gone. Reading
// them frees slots, and the credit returned for them (every slots / 4 chunks) was posted to the
// peer's destroyed QP: its error completion became the connection's sticky error, and the
// messages not yet read failed with "transport retry counter exceeded".
TEST_F(RdmaTransportTest, MessagesThatArrivedBeforeTheGoodbyeStayReadableAfterThePeerLeft) {
  start(/*slots=*/8, /*slotBytes=*/4096);
  std::vector<uint64_t> out(6), in(6, 0);
  Recorder sent;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = 1000 + i;
    p_.client->send(wire::Header{}, &out[i], sizeof(uint64_t), sent.sendCb(i));
  }
  ASSERT_TRUE(sent.wait(out.size()));
  p_.client->close();
  client_->join();  // its goodbye was acknowledged and its QP destroyed
  Recorder got;
  p_.server->recv(&in[0], sizeof(uint64_t), got.recvCb(0));
  p_.server->recv(&in[1], sizeof(uint64_t), got.recvCb(1));
  ASSERT_TRUE(got.wait(2));  // two chunks freed: a credit (batch of 2) is due
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (size_t i = 2; i < in.size(); ++i) p_.server->recv(&in[i], sizeof(uint64_t), got.recvCb(i));
  uint64_t extra = 0;
  p_.server->recv(&extra, sizeof(uint64_t), got.recvCb(in.size()));
  ASSERT_TRUE(got.wait(in.size() + 1));
  const auto statuses = got.statuses();
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_TRUE(statuses[i].ok()) << "message " << i << ": " << statuses[i];
    EXPECT_EQ(in[i], 1000 + i);
  }
  EXPECT_EQ(statuses[in.size()].code(), StatusCode::kRemoteError) << statuses[in.size()];
  EXPECT_NE(statuses[in.size()].message().find("closed the connection"), std::string::npos)
      << statuses[in.size()];
}

// The first error is visible in status() inside the callback it fails (the contract): a send
// failed by the peer's goodbye saw status() OK there, and status() stayed OK for as long as
// unread data was left, while every new send failed.
TEST_F(RdmaTransportTest, ThePeersGoodbyeIsInStatusInsideTheSendItFails) {
  start(/*slots=*/2, /*slotBytes=*/4096);
  std::vector<uint8_t> big(3 * 4096, 7);  // 3 chunks, 2 credits: waits for a receive
  std::promise<std::pair<Status, Status>> failed;
  std::shared_ptr<Connection> client = p_.client;
  client->send(wire::Header{}, big.data(), big.size(), [&failed, client](const Status& s) {
    failed.set_value({s, client->status()});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // two chunks are over
  p_.server->close();
  auto f = failed.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto [sendStatus, statusInCallback] = f.get();
  EXPECT_EQ(sendStatus.code(), StatusCode::kRemoteError) << sendStatus;
  EXPECT_FALSE(statusInCallback.ok()) << "status() was OK inside the failed send's callback";
}

// The peer said goodbye while a message of it was still unread: status() says so (RemoteError),
// and keeps saying so after a local close() (the first error is sticky). close() used to make
// Cancelled the sticky error, so a caller could no longer tell "the peer left" from "we closed".
TEST_F(RdmaTransportTest, StatusStillNamesThePeersGoodbyeAfterALocalClose) {
  start(/*slots=*/8, /*slotBytes=*/4096);
  uint64_t out = 42;
  Recorder sent;
  p_.client->send(wire::Header{}, &out, sizeof(out), sent.sendCb(0));
  ASSERT_TRUE(sent.wait(1));
  ASSERT_TRUE(sent.statuses()[0].ok()) << sent.statuses()[0];
  p_.client->close();
  client_->join();  // its goodbye was acknowledged
  Recorder back;
  p_.server->send(wire::Header{}, &out, sizeof(out), back.sendCb(0));
  ASSERT_TRUE(back.wait(1));
  ASSERT_EQ(back.statuses()[0].code(), StatusCode::kRemoteError) << back.statuses()[0];
  EXPECT_EQ(p_.server->status().code(), StatusCode::kRemoteError) << p_.server->status();
  p_.server->close();
  uint64_t in = 0;
  Recorder after;  // runs on the worker after close(): the close has been carried out
  p_.server->recv(&in, sizeof(in), after.recvCb(0));
  ASSERT_TRUE(after.wait(1));
  EXPECT_FALSE(after.statuses()[0].ok());
  EXPECT_EQ(p_.server->status().code(), StatusCode::kRemoteError) << p_.server->status();
}

// The emulation's modifyQp, except that moving a QP to RTR fails with EINVAL (a wrong GID or
// path on the accepting side).
int modifyQpFailingRtr(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if ((mask & IBV_QP_STATE) != 0 && attr->qp_state == IBV_QPS_RTR) return EINVAL;
  return cofab::testing::emulatedVerbs().modifyQp(qp, attr, mask);
}

// A set-up that fails on the accepting side (here ibv_modify_qp to RTR) reaches the connecting
// side with its reason. It was logged there only, and connect() said "closed the connection".
TEST(RdmaSetUp, AnAcceptingSideFailureReachesTheConnectorWithItsReason) {
  cofab::testing::setEmulatedDeviceCount(1);
  static rdma::VerbsApi failing = cofab::testing::emulatedVerbs();
  failing.modifyQp = &modifyQpFailingRtr;
  auto server = rdma::createContext({.localId = "server"}, {.verbs = &failing});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client =
      rdma::createContext({.localId = "client"}, {.verbs = &cofab::testing::emulatedVerbs()});
  ASSERT_TRUE(client.ok()) << client.status();
  auto l = (*server)->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  auto c = (*client)->connect((*l)->address(), {.localId = "rank 1"}, Deadline::afterMs(5000));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("the accepting side could not set up its end"),
            std::string::npos)
      << c.status();
  EXPECT_NE(c.status().message().find("RTR"), std::string::npos) << c.status();
  (*l)->close();
  (*client)->join();
  (*server)->join();
}

// A side channel that connects and then says nothing (a stopped connector, a stray client) is
// closed at the set-up deadline: the accepting side waited for its QP information without one,
// and a connector that stalled after sending it held a QP, a CQ and the pinned slots.
TEST(RdmaSetUp, AConnectorThatNeverSetsUpIsDroppedAtTheSetUpDeadline) {
  cofab::testing::setEmulatedDeviceCount(1);
  auto server = rdma::createContext(
      {.localId = "server"}, {.verbs = &cofab::testing::emulatedVerbs(), .setupTimeoutMs = 200});
  ASSERT_TRUE(server.ok()) << server.status();
  auto l = (*server)->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  auto tcp = Registry::create("tcp", {.localId = "stalled"});
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  auto conn = (*tcp)->connect((*l)->address(), {.localId = "stalled"}, testDeadline());
  ASSERT_TRUE(conn.ok()) << conn.status();
  Recorder got;
  (*conn)->recvOwned([&got](const Status& st, const wire::Header& h, std::vector<uint8_t>&&) {
    got.record(st, h);
  });
  ASSERT_TRUE(got.wait(1)) << "the accepting side still waits for the set-up (30 s)";
  EXPECT_EQ(got.statuses()[0].code(), StatusCode::kRemoteError) << got.statuses()[0];
  (*tcp)->close();
  (*tcp)->join();
  l->reset();
  (*server)->join();
}

// A connection one end fails (here a message larger than its posted receive) reaches the other
// end with that reason. It ended the side channel without a word, and the other end reported
// "went away without closing the connection", which docs/RDMA.md reads as the peer's death.
TEST_F(RdmaTransportTest, APeersLocalFailureArrivesWithItsReasonNotAsItsDeath) {
  start(8, 4096);
  std::vector<uint8_t> src(100, 1), dst(64);
  uint64_t never = 0;
  Recorder clientRecv;
  p_.client->recv(&never, sizeof(never), clientRecv.recvCb());
  Recorder serverRecv, sent;
  p_.server->recv(dst.data(), dst.size(), serverRecv.recvCb());
  p_.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(serverRecv.wait(1));
  EXPECT_EQ(serverRecv.statuses()[0].code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(clientRecv.wait(1));
  ASSERT_TRUE(sent.wait(1));  // src is lent until then
  const Status s = clientRecv.statuses()[0];
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s;
  EXPECT_NE(s.message().find("failed the connection on its side"), std::string::npos) << s;
  EXPECT_NE(s.message().find("expects 64"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("went away"), std::string::npos) << s;
}

// Callbacks run in posting order even for operations that fail validation: such an operation
// waits behind the earlier ones instead of completing through a task of its own.
TEST_F(RdmaTransportTest, InvalidSendCompletesAfterAnEarlierPendingSendOnClose) {
  start(/*slots=*/2, /*slotBytes=*/4096);
  std::vector<uint8_t> big(3 * 4096, 2);  // 4 chunks, 2 credits, no receive: cannot finish
  Recorder sent;
  p_.client->send(wire::Header{}, big.data(), big.size(), sent.sendCb(0));
  p_.client->send(wire::Header{}, nullptr, 10, sent.sendCb(1));
  p_.client->close();
  ASSERT_TRUE(sent.wait(2));
  EXPECT_EQ(sent.order(), (std::vector<size_t>{0, 1}));
  const auto statuses = sent.statuses();
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].code(), StatusCode::kCancelled) << statuses[0];
  EXPECT_EQ(statuses[1].code(), StatusCode::kInvalidArgument) << statuses[1];
}

TEST_F(RdmaTransportTest, InvalidRecvCompletesAfterAnEarlierPendingRecvOnClose) {
  start(/*slots=*/2, /*slotBytes=*/4096);
  std::vector<uint8_t> dst(3 * 4096);
  Recorder got;
  p_.server->recv(dst.data(), dst.size(), got.recvCb(0));  // nothing is sent: stays pending
  p_.server->recv(nullptr, 10, got.recvCb(1));
  p_.server->close();
  ASSERT_TRUE(got.wait(2));
  EXPECT_EQ(got.order(), (std::vector<size_t>{0, 1}));
  const auto statuses = got.statuses();
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].code(), StatusCode::kCancelled) << statuses[0];
  EXPECT_EQ(statuses[1].code(), StatusCode::kInvalidArgument) << statuses[1];
}

// On a healthy connection an invalid operation keeps its place too, fails only itself and
// consumes no message: the valid ones around it go through in order.
TEST_F(RdmaTransportTest, InvalidOperationsKeepTheirPlaceAndFailOnlyThemselves) {
  start(/*slots=*/2, /*slotBytes=*/4096);
  const std::vector<uint8_t> big = pattern(3 * 4096, 7);  // needs credits back: several polls
  const std::vector<uint8_t> small = pattern(100, 8);
  std::vector<uint8_t> bigIn(big.size()), smallIn(small.size());
  Recorder sent, got;
  p_.server->recv(bigIn.data(), bigIn.size(), got.recvCb(0));
  p_.server->recv(nullptr, 10, got.recvCb(1));
  p_.server->recv(smallIn.data(), smallIn.size(), got.recvCb(2));
  wire::Header h;
  h.sequence = 1;
  p_.client->send(h, big.data(), big.size(), sent.sendCb(0));
  p_.client->send(wire::Header{}, nullptr, 10, sent.sendCb(1));
  h.sequence = 2;
  p_.client->send(h, small.data(), small.size(), sent.sendCb(2));
  ASSERT_TRUE(sent.wait(3));
  ASSERT_TRUE(got.wait(3));
  EXPECT_EQ(sent.order(), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(got.order(), (std::vector<size_t>{0, 1, 2}));
  const auto ss = sent.statuses();
  const auto gs = got.statuses();
  ASSERT_EQ(ss.size(), 3u);
  ASSERT_EQ(gs.size(), 3u);
  EXPECT_TRUE(ss[0].ok()) << ss[0];
  EXPECT_EQ(ss[1].code(), StatusCode::kInvalidArgument) << ss[1];
  EXPECT_TRUE(ss[2].ok()) << ss[2];
  EXPECT_TRUE(gs[0].ok()) << gs[0];
  EXPECT_EQ(gs[1].code(), StatusCode::kInvalidArgument) << gs[1];
  EXPECT_TRUE(gs[2].ok()) << gs[2];
  EXPECT_EQ(got.headers()[0].sequence, 1u);
  EXPECT_EQ(got.headers()[2].sequence, 2u);
  EXPECT_TRUE(bigIn == big);
  EXPECT_TRUE(smallIn == small);
  EXPECT_TRUE(p_.client->status().ok()) << p_.client->status();
  EXPECT_TRUE(p_.server->status().ok()) << p_.server->status();
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
  EXPECT_EQ(cache.size(), 2u);              // the least recently used (a) was evicted
  EXPECT_EQ((*r1)->lkey(), (*r2)->lkey());  // still valid while held
  EXPECT_EQ(cache.get(nullptr, 5).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cofab::transport::testing
