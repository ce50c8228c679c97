// The dpdk transport in one process: two contexts on in-process ring ports (the frames go
// through the net_ring PMD and the engine's full RX/TX path). Ordering, sizes, close, peer
// death, loss injection and malformed frames. Skips with EAL's reason when EAL cannot start.
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "core/param.h"
#include "fabric/transport/dpdk/factory.h"
#include "fabric/transport/dpdk/frame.h"
#include "tests/fabric/transport/transport_test_util.h"

namespace cofab::transport::testing {
namespace {

StatusOr<std::shared_ptr<Context>> makeContext(const std::string& id, double dropRate = 0,
                                               int64_t seed = 1, int64_t peerTimeoutMs = 0,
                                               int64_t pipeFrames = 0, double corruptRate = 0,
                                               double dropDataRate = 0) {
  return dpdk::createContext({.localId = id}, {.dropRate = dropRate,
                                               .dropSeed = seed,
                                               .corruptRate = corruptRate,
                                               .dropDataRate = dropDataRate,
                                               .peerTimeoutMs = peerTimeoutMs,
                                               .pipeFrames = pipeFrames});
}

class DpdkTransportTest : public ::testing::Test {
 protected:
  void start(double dropRate = 0, int64_t peerTimeoutMs = 0, int64_t pipeFrames = 0) {
    auto s = makeContext("server", serverDropRate_ >= 0 ? serverDropRate_ : dropRate, 11,
                         peerTimeoutMs, pipeFrames, corruptRate_, serverDropDataRate_);
    if (s.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << s.status();
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *s;
    auto c = makeContext("client", dropRate, 22, peerTimeoutMs, pipeFrames, corruptRate_);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *c;
    auto l = server_->listen({});
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(l).value();
    auto conn = client_->connect(listener_->address(), {.localId = "client-conn"}, testDeadline());
    ASSERT_TRUE(conn.ok()) << conn.status();
    pair_.client = *conn;
    auto a = listener_->accept(testDeadline());
    ASSERT_TRUE(a.ok()) << a.status();
    pair_.server = *a;
  }
  void TearDown() override {
    pair_ = {};
    listener_.reset();
    if (client_) client_->join();
    if (server_) server_->join();
  }

  // Sends `count` messages of varied sizes and checks each arrives once, in order, intact.
  void streamInOrder(int count, size_t maxSize) {
    std::vector<std::vector<uint8_t>> sent(count);
    std::mutex mu;
    std::vector<std::pair<wire::Header, std::vector<uint8_t>>> got;
    Recorder recvd;
    Recorder sends;
    for (int i = 0; i < count; ++i) {
      pair_.server->recvOwned(
          [&](const Status& s, const wire::Header& h, std::vector<uint8_t>&& d) {
            {
              std::lock_guard<std::mutex> lock(mu);
              got.emplace_back(h, std::move(d));
            }
            recvd.record(s, h);
          });
    }
    for (int i = 0; i < count; ++i) {
      sent[i] = pattern((static_cast<size_t>(i) * 7919) % (maxSize + 1), i);
      wire::Header h;
      h.sequence = static_cast<uint64_t>(i);
      h.flags = wire::kFlagPayloadCrc;
      pair_.client->send(h, sent[i].data(), sent[i].size(), sends.sendCb(i));
    }
    ASSERT_TRUE(sends.wait(count, std::chrono::seconds(25)));
    ASSERT_TRUE(recvd.wait(count, std::chrono::seconds(25)))
        << "only " << recvd.count() << " of " << count << " messages arrived";
    for (const auto& s : sends.statuses()) ASSERT_TRUE(s.ok()) << s;
    for (const auto& s : recvd.statuses()) ASSERT_TRUE(s.ok()) << s;
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < count; ++i) {
      ASSERT_EQ(got[i].first.sequence, static_cast<uint64_t>(i)) << "out of order at " << i;
      ASSERT_TRUE(got[i].second == sent[i]) << "payload " << i << " differs";
    }
  }

  double corruptRate_ = 0;         // set before start()
  double serverDropRate_ = -1;     // set before start(); < 0: start()'s dropRate
  double serverDropDataRate_ = 0;  // set before start()
  // For operations that may still complete in TearDown's joins (declared before the contexts,
  // so they outlive them).
  Recorder lateRecv_;
  Recorder lateSend_;
  std::shared_ptr<Context> server_;
  std::shared_ptr<Context> client_;
  std::unique_ptr<Listener> listener_;
  ConnPair pair_;
};

void roundTrip(ConnPair& p, size_t size, int pieces, uint32_t seed) {
  const auto src = pattern(size, seed);
  std::vector<uint8_t> dst(size, 0xAA);
  std::vector<ConstSlice> slices;
  size_t off = 0;
  for (int i = 0; i < pieces; ++i) {
    const size_t n = i + 1 == pieces ? size - off : size / pieces;
    slices.push_back({src.data() + off, n});
    off += n;
  }
  Recorder sent;
  Recorder got;
  wire::Header h;
  h.key = seed;
  p.server->recv(dst.data(), dst.size(), got.recvCb());
  p.client->send(h, ConstSlices(slices), sent.sendCb());
  ASSERT_TRUE(sent.wait(1)) << "send of " << size << " bytes did not complete";
  ASSERT_TRUE(got.wait(1)) << "recv of " << size << " bytes did not complete";
  ASSERT_TRUE(sent.statuses()[0].ok()) << sent.statuses()[0];
  ASSERT_TRUE(got.statuses()[0].ok()) << got.statuses()[0];
  EXPECT_EQ(got.headers()[0].key, seed);
  EXPECT_EQ(got.headers()[0].payloadLength, size);
  EXPECT_TRUE(src == dst) << "payload of " << size << " bytes differs";
}

TEST_F(DpdkTransportTest, HandshakeNamesBothEnds) {
  start();
  if (IsSkipped()) return;
  EXPECT_EQ(pair_.server->peerId(), "client-conn");
  EXPECT_EQ(pair_.client->peerId(), "server");
  EXPECT_NE(pair_.client->describe().find("dpdk"), std::string::npos);
}

TEST_F(DpdkTransportTest, MessageSizesZeroOneOddAndLarge) {
  start();
  if (IsSkipped()) return;
  uint32_t seed = 1;
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{1439}, size_t{1440}, size_t{1441},
                      size_t{4093}, size_t{65537}, size_t{(1u << 20) + 3}, size_t{16u << 20}}) {
    for (int pieces : {1, 3}) {
      if (size < 3 && pieces > 1) continue;
      SCOPED_TRACE("size " + std::to_string(size) + " pieces " + std::to_string(pieces));
      roundTrip(pair_, size, pieces, seed++);
    }
  }
}

TEST_F(DpdkTransportTest, ManySmallAndMediumMessagesInOrder) {
  start();
  if (IsSkipped()) return;
  streamInOrder(500, 5000);
}

TEST_F(DpdkTransportTest, OnePercentLossDeliversEverythingOnceInOrder) {
  start(0.01);
  if (IsSkipped()) return;
  streamInOrder(400, 20000);
  auto s = dpdk::stats(*server_);
  ASSERT_TRUE(s.ok());
  EXPECT_GT(s->rxInjectedDrops, 0u);
}

TEST_F(DpdkTransportTest, TenPercentLossDeliversEverythingOnceInOrder) {
  start(0.10);
  if (IsSkipped()) return;
  streamInOrder(300, 20000);
  auto s = dpdk::stats(*server_);
  auto c = dpdk::stats(*client_);
  ASSERT_TRUE(s.ok() && c.ok());
  EXPECT_GT(s->rxInjectedDrops, 0u);
  EXPECT_GT(c->retransmits, 0u);
  // Every Data frame the client built is delivered exactly once (the counter moves on the
  // poller just after the last receive's callback, so wait for it), and the bench's cost
  // figures have a poller CPU clock to read.
  const Deadline d = Deadline::afterMs(5000);
  while (s.ok() && s->rxDataDelivered < c->txDataFrames && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = dpdk::stats(*server_);
  }
  ASSERT_TRUE(s.ok());
  EXPECT_GT(c->txDataFrames, 0u);
  EXPECT_EQ(s->rxDataDelivered, c->txDataFrames);
  EXPECT_GT(c->pollerCpuNs, 0u);
  EXPECT_GT(s->pollerCpuNs, 0u);
}

// A flipped bit is caught by the frame CRC wherever the frame goes, including Data frames whose
// payload is checked while it is copied straight into the posted receive (a failed check has
// already written there), in order or, with frames lost as well, past a hole: every message
// still arrives once, in order and intact, into owned buffers (with the message payload CRC)
// and into the caller's (without).
TEST_F(DpdkTransportTest, CorruptedFramesAreCaughtAndResentIntact) {
  corruptRate_ = 0.05;
  start(0.03);
  if (IsSkipped()) return;
  streamInOrder(200, 20000);
  roundTrip(pair_, (1u << 20) + 3, 1, 5);
  roundTrip(pair_, 300001, 3, 6);
  auto s = dpdk::stats(*server_);
  auto c = dpdk::stats(*client_);
  ASSERT_TRUE(s.ok() && c.ok());
  EXPECT_GT(s->rxInjectedCorruptions, 0u);
  EXPECT_GT(s->rxInjectedDrops, 0u);
  EXPECT_GT(s->rxBadChecksum, 0u);
  EXPECT_GT(s->rxDataPlaced, 0u);
  EXPECT_LE(s->rxDataPlaced, s->rxDataDelivered);  // a subset of the delivered frames
  EXPECT_GT(c->retransmits, 0u);
  EXPECT_TRUE(pair_.server->status().ok()) << pair_.server->status();
  EXPECT_TRUE(pair_.client->status().ok()) << pair_.client->status();
}

// recvRouted is native on dpdk: the route sees the header, the payload lands in the routed
// memory (placed frame by frame, not copied from a vector), also when the message was already
// waiting when the receive was posted, and a null route answer falls back to an owned vector.
TEST_F(DpdkTransportTest, RecvRoutedLandsInTheRoutedMemoryEvenForAWaitingMessage) {
  start();
  if (IsSkipped()) return;
  const auto big = pattern((1u << 20) + 5, 3);
  const auto small = pattern(700, 4);
  Recorder sent;
  wire::Header h;
  h.key = 1;
  pair_.client->send(h, big.data(), big.size(), sent.sendCb());
  h.key = 2;
  pair_.client->send(h, small.data(), small.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(2));
  // Whether or not the frames are held by now, the route must be asked once per message.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<uint8_t> dst(big.size(), 0xAA);
  std::mutex mu;
  std::vector<uint64_t> routed;
  std::vector<std::vector<uint8_t>> payloads;
  Recorder got;
  auto route = [&](const wire::Header& hdr) -> MutableSlice {
    std::lock_guard<std::mutex> lock(mu);
    routed.push_back(hdr.key);
    return hdr.key == 1 ? MutableSlice{dst.data(), dst.size(), nullptr} : MutableSlice{};
  };
  auto done = [&](const Status& st, const wire::Header& hdr, std::vector<uint8_t>&& payload) {
    {
      std::lock_guard<std::mutex> lock(mu);
      payloads.push_back(std::move(payload));
    }
    got.record(st, hdr);
  };
  pair_.server->recvRouted(route, done);
  pair_.server->recvRouted(route, done);
  ASSERT_TRUE(got.wait(2));
  for (const auto& st : got.statuses()) ASSERT_TRUE(st.ok()) << st;
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(routed, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(dst == big) << "the routed message did not land in the routed memory";
  EXPECT_TRUE(payloads[0].empty());
  EXPECT_EQ(payloads[1], small);
}

TEST(DpdkTransportOptions, ACorruptRateOutsideItsRangeIsRefused) {
  for (double rate : {-0.1, 0.6}) {
    auto c = dpdk::createContext({.localId = "x"}, {.corruptRate = rate});
    if (c.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << c.status();
    ASSERT_EQ(c.status().code(), StatusCode::kInvalidArgument) << rate;
    EXPECT_NE(c.status().message().find("corruptRate"), std::string::npos) << c.status();
  }
}

// A port asked for by name that this process does not have is an error, also where contexts
// otherwise get in-process ring ports: one was made in its place, connected to nothing, and
// the connect failed much later with no answer.
TEST(DpdkTransportOptions, AnUnknownPortNameIsRefusedInRingModeToo) {
  auto c = dpdk::createContext({.localId = "x"}, {.port = "net_memif7"});
  if (c.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << c.status();
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("net_memif7"), std::string::npos) << c.status();
}

// A pool too small for the transport's thresholds is refused when the port is set up: with
// 1023 mbufs (the old floor) every frame past a hole was dropped, and a port whose RX ring is
// filled from the pool never built a data frame.
TEST(DpdkTransportOptions, AnMbufPoolBelowTheThresholdsIsRefused) {
  ScopedParamOverride small("COFAB_DPDK_MBUFS", "1023");
  auto c = dpdk::createContext({.localId = "x"});
  if (c.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << c.status();
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("COFAB_DPDK_MBUFS"), std::string::npos) << c.status();
}

// Options given in code have their variables' ranges: a 5 ms peer timeout (the variable's
// floor is 50) and a 1 s nap (its ceiling is 100 ms) passed unchecked.
TEST(DpdkTransportOptions, APeerTimeoutOrNapOutsideTheVariablesRangesIsRefused) {
  auto shortTimeout = dpdk::createContext({.localId = "x"}, {.peerTimeoutMs = 5});
  if (shortTimeout.status().code() == StatusCode::kUnavailable)
    GTEST_SKIP() << shortTimeout.status();
  EXPECT_EQ(shortTimeout.status().code(), StatusCode::kInvalidArgument) << shortTimeout.status();
  EXPECT_NE(shortTimeout.status().message().find("peerTimeoutMs"), std::string::npos)
      << shortTimeout.status();
  auto longNap = dpdk::createContext({.localId = "x"}, {.idleNapUs = 1'000'000});
  EXPECT_EQ(longNap.status().code(), StatusCode::kInvalidArgument) << longNap.status();
  EXPECT_NE(longNap.status().message().find("idleNapUs"), std::string::npos) << longNap.status();
}

TEST_F(DpdkTransportTest, ATinyPipeStallsTheSenderButLosesNothingUnderLoss) {
  // Four frames past the newest acknowledged one: the sender waits on acks all the time, and
  // holes below the pipe are still resent and filled.
  start(0.10, 0, 4);
  if (IsSkipped()) return;
  streamInOrder(100, 20000);
  auto c = dpdk::stats(*client_);
  ASSERT_TRUE(c.ok());
  EXPECT_GT(c->txStallPipe, 0u);
  EXPECT_GT(c->retransmits, 0u);
}

TEST(DpdkTransportOptions, APipeOutsideTheWindowIsRefused) {
  for (int64_t pipe : {int64_t{1025}, int64_t{-1}}) {
    auto c = makeContext("client", 0, 1, 0, pipe);
    if (c.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << c.status();
    ASSERT_FALSE(c.ok()) << "pipe " << pipe;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(c.status().message().find("pipeFrames " + std::to_string(pipe)), std::string::npos)
        << c.status();
  }
}

TEST_F(DpdkTransportTest, LargeMessageUnderLoss) {
  start(0.10);
  if (IsSkipped()) return;
  roundTrip(pair_, (4u << 20) + 5, 2, 3);
}

TEST_F(DpdkTransportTest, FullDuplex) {
  start();
  if (IsSkipped()) return;
  const auto a = pattern(3 << 20, 1);
  const auto b = pattern(3 << 20, 2);
  std::vector<uint8_t> ra(a.size()), rb(b.size());
  Recorder rec;
  pair_.server->recv(ra.data(), ra.size(), rec.recvCb());
  pair_.client->recv(rb.data(), rb.size(), rec.recvCb());
  pair_.client->send(wire::Header{}, a.data(), a.size(), rec.sendCb());
  pair_.server->send(wire::Header{}, b.data(), b.size(), rec.sendCb());
  ASSERT_TRUE(rec.wait(4));
  for (const auto& s : rec.statuses()) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(ra == a);
  EXPECT_TRUE(rb == b);
}

TEST_F(DpdkTransportTest, CloseCancelsPendingAndSentDataStillArrives) {
  start();
  if (IsSkipped()) return;
  const auto src = pattern(50000, 8);
  Recorder sent;
  pair_.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  ASSERT_TRUE(sent.statuses()[0].ok());
  pair_.client->close();
  std::vector<uint8_t> dst(src.size());
  Recorder got;
  pair_.server->recv(dst.data(), dst.size(), got.recvCb());
  pair_.server->recv(dst.data(), dst.size(), got.recvCb());
  ASSERT_TRUE(got.wait(2));
  EXPECT_TRUE(got.statuses()[0].ok()) << got.statuses()[0];
  EXPECT_TRUE(dst == src);
  EXPECT_EQ(got.statuses()[1].code(), StatusCode::kRemoteError) << got.statuses()[1];
  EXPECT_NE(got.statuses()[1].message().find("client-conn"), std::string::npos);
  // The closed side: pending were cancelled, later operations refused.
  Recorder later;
  pair_.client->recv(dst.data(), dst.size(), later.recvCb());
  ASSERT_TRUE(later.wait(1));
  EXPECT_EQ(later.statuses()[0].code(), StatusCode::kFailedPrecondition) << later.statuses()[0];
}

// The peer sends, closes and goes away before this side reads: its Fin is held in sequence, so
// what it sent is all here and must stay readable, even once the peer answers our keepalives
// with a reset (it forgot the connection) or, its context closed, answers nothing at all.
void expectDataThenClose(ConnPair& pair, const std::vector<uint8_t>& src) {
  std::vector<uint8_t> dst(src.size());
  Recorder got;
  pair.server->recv(dst.data(), dst.size(), got.recvCb());
  pair.server->recv(dst.data(), dst.size(), got.recvCb());
  ASSERT_TRUE(got.wait(2));
  EXPECT_TRUE(got.statuses()[0].ok()) << got.statuses()[0];
  EXPECT_TRUE(dst == src);
  EXPECT_EQ(got.statuses()[1].code(), StatusCode::kRemoteError) << got.statuses()[1];
  EXPECT_NE(got.statuses()[1].message().find("closed"), std::string::npos) << got.statuses()[1];
  // Nothing sent now reaches the peer, and the send says so.
  Recorder sent;
  pair.server->send(wire::Header{}, src.data(), 10, sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  EXPECT_FALSE(sent.statuses()[0].ok());
  // One sticky Status (connection.h): the receive after the Fin and the later send fail with
  // what status() says. They each said something else ("closed the connection", "is gone").
  const Status sticky = pair.server->status();
  EXPECT_EQ(got.statuses()[1].message(), sticky.message());
  EXPECT_EQ(sent.statuses()[0].message(), sticky.message());
}

TEST_F(DpdkTransportTest, DataOfAPeerThatClosedAndResetStaysReadable) {
  start();
  if (IsSkipped()) return;
  const auto src = pattern(50000, 9);
  Recorder sent;
  pair_.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  ASSERT_TRUE(sent.statuses()[0].ok());
  pair_.client->close();
  // Our keepalive (every 100 ms) reaches a peer that finished and forgot the connection: it
  // answers with a reset, before anything here is read.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  // A send fails now (nothing reaches the peer), and status() says so inside its callback, as
  // the contract wants of the first error (it stayed OK); what arrived stays readable.
  std::promise<std::pair<Status, Status>> early;
  pair_.server->send(wire::Header{}, src.data(), 10, [&](const Status& s) {
    early.set_value({s, pair_.server->status()});
  });
  auto f = early.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto [sendStatus, statusInCallback] = f.get();
  EXPECT_EQ(sendStatus.code(), StatusCode::kRemoteError) << sendStatus;
  EXPECT_FALSE(statusInCallback.ok()) << "status() was OK inside the failed send's callback";
  expectDataThenClose(pair_, src);
}

// A peer timeout under the keepalive's old fixed 100 ms (COFAB_DPDK_PEER_TIMEOUT_MS takes 50
// and up): idle but healthy connections must stay up. Their keepalive came every 100 ms, so
// every idle connection failed with "nothing heard from the peer".
TEST_F(DpdkTransportTest, AShortPeerTimeoutDoesNotFailHealthyIdleConnections) {
  start(0, /*peerTimeoutMs=*/90);
  if (IsSkipped()) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // idle, many timeouts long
  EXPECT_TRUE(pair_.client->status().ok()) << pair_.client->status();
  EXPECT_TRUE(pair_.server->status().ok()) << pair_.server->status();
  roundTrip(pair_, 1000, 1, 7);
}

TEST_F(DpdkTransportTest, DataOfAPeerThatClosedAndWentSilentStaysReadable) {
  start(0, /*peerTimeoutMs=*/200);
  if (IsSkipped()) return;
  const auto src = pattern(50000, 10);
  Recorder sent;
  pair_.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  ASSERT_TRUE(sent.statuses()[0].ok());
  pair_.client->close();
  client_->join();  // its whole context goes: it answers nothing any more
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the peer timeout
  expectDataThenClose(pair_, src);
}

// An operation started from a callback while the command ring is full: the poller runs that
// callback, and only the poller empties the ring, so it must never wait for ring space (the
// application thread that waits for it holds the post lock, too).
TEST_F(DpdkTransportTest, ACallbackPostingWhileTheCommandRingIsFullDoesNotDeadlock) {
  start();
  if (IsSkipped()) return;
  const auto m = pattern(100, 4);
  Recorder sent;
  pair_.client->send(wire::Header{}, m.data(), m.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  std::atomic<int> posted{0};
  std::atomic<bool> inCallback{false};
  Recorder echoed;
  std::vector<uint8_t> got(m.size());
  auto server = pair_.server;
  pair_.server->recv(got.data(), got.size(), [&, server](const Status& s, const wire::Header& h) {
    inCallback = true;
    // Hold the poller until the application has filled the ring (4095 usable slots) and
    // posted past it; then start an operation from here.
    while (posted.load() < 4095) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (s.ok()) server->send(h, got.data(), got.size(), echoed.sendCb());
  });
  while (!inCallback) std::this_thread::yield();
  std::vector<uint8_t> sink(1);
  for (int i = 0; i < 5000; ++i) {
    pair_.server->recv(sink.data(), sink.size(), [](const Status&, const wire::Header&) {});
    ++posted;
  }
  ASSERT_TRUE(echoed.wait(1, std::chrono::seconds(20))) << "the callback's send never ran";
  EXPECT_TRUE(echoed.statuses()[0].ok()) << echoed.statuses()[0];
}

// A connection closed while its peer reads nothing, its window full: the Fin still gets in (data
// frames leave the window's last frame to it), so the close completes and the message sent
// before it stays readable after the closed side forgot the connection and answers with
// resets; the message cut by the close fails the peer's receive, naming the close. Before, the
// Fin waited for window space, the drain gave up without it after the peer timeout, and the
// peer took the reset that followed for a failure and dropped the complete message too.
TEST_F(DpdkTransportTest, ACloseIntoAFullWindowStillEndsWithItsFin) {
  start(0, /*peerTimeoutMs=*/300);
  if (IsSkipped()) return;
  const auto a = pattern(1'000'000, 5);  // about 700 of the window's 1024 frames
  const auto b = pattern(1'000'000, 6);  // fills the rest: the server never reads, for now
  Recorder sentA, sentB;
  pair_.client->send(wire::Header{}, a.data(), a.size(), sentA.sendCb());
  pair_.client->send(wire::Header{}, b.data(), b.size(), sentB.sendCb());
  ASSERT_TRUE(sentA.wait(1));
  ASSERT_TRUE(sentA.statuses()[0].ok()) << sentA.statuses()[0];
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the window is full now
  pair_.client->close();
  ASSERT_TRUE(sentB.wait(1));
  EXPECT_EQ(sentB.statuses()[0].code(), StatusCode::kCancelled) << sentB.statuses()[0];
  // Past the client's drain bound and several of the server's keepalives (each answered by a
  // reset once the client forgot the connection).
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  std::vector<uint8_t> gotA(a.size()), gotB(b.size());
  Recorder got;
  pair_.server->recv(gotA.data(), gotA.size(), got.recvCb());
  pair_.server->recv(gotB.data(), gotB.size(), got.recvCb());
  ASSERT_TRUE(got.wait(2));
  EXPECT_TRUE(got.statuses()[0].ok()) << got.statuses()[0];
  EXPECT_TRUE(gotA == a);
  EXPECT_EQ(got.statuses()[1].code(), StatusCode::kRemoteError) << got.statuses()[1];
  EXPECT_NE(got.statuses()[1].message().find("in the middle of a message"), std::string::npos)
      << got.statuses()[1];
}

// A window update lost while the updating side streams data the other way is repeated by the
// keepalive. The client sends A (256 messages) to a server that reads in batches: it lets the
// client fill its window (1024 frames, 5.6 messages) and wait, everything acknowledged, then
// reads the five messages held at once and sends one ack reopening the window; meanwhile the
// server streams B to the client until A is in. 10% of the client's received frames are
// dropped (none of the server's), so about one batch in ten loses that ack. Before, the
// server's keepalive counted from its last frame of any kind and never fired while B flowed:
// A stalled for good at the first lost window update (B only stops once A is in).
TEST_F(DpdkTransportTest, ALostWindowUpdateIsRepeatedWhileDataFlowsTheOtherWay) {
  serverDropRate_ = 0;  // A's frames all arrive: no resend of A draws a fresh ack either
  start(0.1);
  if (IsSkipped()) return;
  constexpr int kMessages = 256;
  constexpr int kBatch = 5;
  const size_t kBytes = 256 << 10;
  std::atomic<bool> aDone{false};
  // B: the client reads it as it comes (each receive posted again from its callback).
  const auto b = pattern(kBytes, 3);
  std::vector<uint8_t> sink(kBytes);
  auto client = pair_.client;
  std::function<void(const Status&, const wire::Header&)> readB;
  readB = [&, client](const Status& st, const wire::Header&) {
    if (st.ok() && !aDone) client->recv(sink.data(), sink.size(), readB);
  };
  client->recv(sink.data(), sink.size(), readB);
  // Recorders outlive the operations they record (a wait that gives up leaves one posted).
  std::deque<Recorder> sentB, gotA;
  std::thread streamer([&] {
    const Deadline until = Deadline::afterMs(60000);
    while (!aDone && !until.expired()) {
      Recorder& r = sentB.emplace_back();
      pair_.server->send(wire::Header{}, b.data(), b.size(), r.sendCb());
      if (!r.wait(1) || !r.statuses()[0].ok()) return;
    }
  });
  std::vector<std::vector<uint8_t>> a;
  Recorder sentA;
  for (int i = 0; i < kMessages; ++i) {
    a.push_back(pattern(kBytes, 100 + i));
    client->send(wire::Header{}, a.back().data(), a.back().size(), sentA.sendCb(i));
  }
  std::vector<std::vector<uint8_t>> got(kBatch, std::vector<uint8_t>(kBytes));
  int received = 0;
  bool stalled = false;
  while (received < kMessages && !stalled) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the client fills the window
    const int batch = std::min(kBatch, kMessages - received);
    Recorder& r = gotA.emplace_back();
    for (int j = 0; j < batch; ++j) pair_.server->recv(got[j].data(), kBytes, r.recvCb(j));
    stalled = !r.wait(batch, std::chrono::seconds(20));
    for (int j = 0; j < batch && !stalled; ++j) {
      ASSERT_TRUE(r.statuses()[j].ok()) << r.statuses()[j];
      ASSERT_TRUE(got[j] == a[received + j]) << "message " << received + j << " differs";
    }
    if (!stalled) received += batch;
  }
  aDone = true;
  streamer.join();
  EXPECT_EQ(received, kMessages) << "A stalled after " << received << " messages";
  EXPECT_TRUE(sentA.wait(kMessages, std::chrono::seconds(20)));
  // The callbacks above use this scope's variables: end every operation here.
  client_->join();
  server_->join();
}

TEST_F(DpdkTransportTest, LocalCloseCancelsPendingReceives) {
  start();
  if (IsSkipped()) return;
  std::vector<uint8_t> buf(100);
  Recorder pending;
  for (int i = 0; i < 5; ++i) pair_.server->recv(buf.data(), buf.size(), pending.recvCb(i));
  pair_.server->close();
  ASSERT_TRUE(pending.wait(5));
  for (const auto& s : pending.statuses()) EXPECT_EQ(s.code(), StatusCode::kCancelled) << s;
  EXPECT_EQ(pair_.server->status().code(), StatusCode::kCancelled);
}

TEST_F(DpdkTransportTest, SizeMismatchIsAClearError) {
  start();
  if (IsSkipped()) return;
  std::vector<uint8_t> src(100), dst(64);
  Recorder rec;
  pair_.server->recv(dst.data(), dst.size(), rec.recvCb());
  pair_.client->send(wire::Header{}, src.data(), src.size(), [](const Status&) {});
  ASSERT_TRUE(rec.wait(1));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kInvalidArgument) << rec.statuses()[0];
  EXPECT_NE(rec.statuses()[0].message().find("expects 64"), std::string::npos);
}

// The peer's context goes away while a receive is pending: RemoteError naming the peer. (A
// killed peer process, which cannot say goodbye, is covered by the two-process memif test.)
TEST_F(DpdkTransportTest, PeerContextGoneGivesRemoteError) {
  start(0, 500);
  if (IsSkipped()) return;
  std::vector<uint8_t> buf(1000);
  Recorder rec;
  pair_.server->recv(buf.data(), buf.size(), rec.recvCb());
  client_->join();  // the client's connections close with it: the server sees RemoteError
  ASSERT_TRUE(rec.wait(1, std::chrono::seconds(10)));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kRemoteError) << rec.statuses()[0];
  EXPECT_NE(rec.statuses()[0].message().find("client-conn"), std::string::npos);
}

// Every Data frame is lost on the way while acks and keepalives pass (a link whose MTU is below
// the frames'): the peer's keepalives used to keep the connection alive forever, the sender
// retrying without end. Now the sender fails once nothing was acknowledged for the peer timeout.
TEST_F(DpdkTransportTest, APeerThatAnswersButReceivesNoDataFailsTheSender) {
  serverDropDataRate_ = 1;
  start(0, /*peerTimeoutMs=*/300);
  if (IsSkipped()) return;
  // Larger than the window, so the send waits on acks that never come.
  static std::vector<uint8_t> big(4 << 20, 0x5A);  // outlives the contexts, like the recorders
  static std::vector<uint8_t> buf(big.size());
  pair_.server->recv(buf.data(), buf.size(), lateRecv_.recvCb());
  pair_.client->send(wire::Header{}, big.data(), big.size(), lateSend_.sendCb());
  ASSERT_TRUE(lateSend_.wait(1, std::chrono::seconds(20)))
      << "the send neither finished nor failed";
  const Status s = lateSend_.statuses()[0];
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s;
  EXPECT_NE(s.message().find("acknowledged none of our frames"), std::string::npos) << s;
}

TEST_F(DpdkTransportTest, ConnectWithoutListenerTimesOutNamingTheAddress) {
  start();
  if (IsSkipped()) return;
  const std::string address = listener_->address();
  listener_->close();
  auto r = client_->connect(address, {}, Deadline::afterMs(300));
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find(address), std::string::npos) << r.status();
  EXPECT_EQ(client_->connect("not an address", {}, Deadline::afterMs(100)).status().code(),
            StatusCode::kInvalidArgument);
}

// Malformed and foreign frames are counted and dropped; the connection keeps working.
TEST_F(DpdkTransportTest, MalformedFramesAreCountedAndDropped) {
  start();
  if (IsSkipped()) return;
  auto local = dpdk::localAddress(*server_);
  ASSERT_TRUE(local.ok());
  auto me = dpdk::parseNetAddress(*local);
  ASSERT_TRUE(me.ok());
  dpdk::NetAddress other{{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}, 0x0A636363, 5555};
  auto frame = [&](dpdk::FrameKind kind, uint32_t dstConn, size_t payload) {
    dpdk::FrameHeader h;
    h.kind = kind;
    h.dstConn = dstConn;
    h.srcConn = 77;
    h.seq = 1;
    h.length = static_cast<uint16_t>(payload);
    std::vector<uint8_t> f(dpdk::frameSize(h), 0x5A);
    dpdk::writeFrameHeaders(f.data(), other, *me, h);
    dpdk::sealFrame(f.data());
    return f;
  };
  const auto good = frame(dpdk::FrameKind::kData, 12345, 100);
  auto badCrc = good;
  badCrc.back() ^= 1;
  auto badLen = good;
  badLen[dpdk::kEthHeaderSize + 3] += 9;  // IP total length past the frame
  auto foreign = good;
  foreign[dpdk::kEthHeaderSize + dpdk::kIpv4HeaderSize + dpdk::kUdpHeaderSize] = 0;  // not cofab
  const std::vector<uint8_t> runt(7, 0xFF);
  auto badKind = frame(static_cast<dpdk::FrameKind>(99), 1, 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(dpdk::injectFrame(*server_, good).ok());  // unknown connection
    ASSERT_TRUE(dpdk::injectFrame(*server_, badCrc).ok());
    ASSERT_TRUE(dpdk::injectFrame(*server_, badLen).ok());
    ASSERT_TRUE(dpdk::injectFrame(*server_, foreign).ok());
    ASSERT_TRUE(dpdk::injectFrame(*server_, runt).ok());
    ASSERT_TRUE(dpdk::injectFrame(*server_, badKind).ok());
    ASSERT_TRUE(dpdk::injectFrame(*server_, {}).ok());
  }
  // The connection still works, and the frames above were processed before this one's.
  roundTrip(pair_, 3000, 1, 9);
  const Deadline d = Deadline::afterMs(5000);
  StatusOr<dpdk::DpdkStats> s = dpdk::stats(*server_);
  while (s.ok() && s->rxUnknownConnection < 3 && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = dpdk::stats(*server_);
  }
  ASSERT_TRUE(s.ok());
  EXPECT_GE(s->rxUnknownConnection, 3u);
  EXPECT_GE(s->rxBadChecksum, 3u);
  EXPECT_GE(s->rxBadLength, 3u + 3u + 3u);  // bad IP length, runts, empty frames
  EXPECT_GE(s->rxForeign, 3u);
  EXPECT_GE(s->rxBadHeader, 3u);
  EXPECT_TRUE(pair_.server->status().ok());
}

// A Syn whose Ethernet source (which no checksum covers) is not its sender's: the copy of the
// addresses in its CRC-covered payload says so, and it is dropped rather than accepted as a
// connection to a MAC nobody has (the sender's repeated Syn would then find it and never
// talk to its peer). One with matching addresses is accepted: the check is not just a refusal.
TEST_F(DpdkTransportTest, ASynWhoseAddressesDisagreeWithItsPayloadIsDropped) {
  start();
  if (IsSkipped()) return;
  auto l = server_->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  auto listenAt = dpdk::parseNetAddress((*l)->address());
  ASSERT_TRUE(listenAt.ok());
  const dpdk::NetAddress sender{{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}, 0x0A636363, 5555};
  auto syn = [&](const dpdk::NetAddress& claimed, uint32_t conn) {
    dpdk::FrameHeader h;
    h.kind = dpdk::FrameKind::kSyn;
    h.srcConn = conn;
    const std::string id = "injected";
    h.length = static_cast<uint16_t>(dpdk::kSetUpAddressBytes + id.size());
    std::vector<uint8_t> f(dpdk::frameSize(h));
    uint8_t* p = dpdk::writeFrameHeaders(f.data(), sender, *listenAt, h);
    std::memcpy(dpdk::writeSetUpAddresses(p, claimed, listenAt->port), id.data(), id.size());
    dpdk::sealFrame(f.data());
    return f;
  };
  dpdk::NetAddress flipped = sender;
  flipped.mac[5] ^= 0x10;  // what the sender wrote; the header above says ...55
  auto before = dpdk::stats(*server_);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(dpdk::injectFrame(*server_, syn(flipped, 91)).ok());
  const Deadline d = Deadline::afterMs(10000);
  auto s = dpdk::stats(*server_);
  while (s.ok() && s->rxBadHeader == before->rxBadHeader && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    s = dpdk::stats(*server_);
  }
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rxBadHeader, before->rxBadHeader + 1) << "the disagreeing Syn was not refused";
  ASSERT_TRUE(dpdk::injectFrame(*server_, syn(sender, 92)).ok());
  auto accepted = (*l)->accept(testDeadline());
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ((*accepted)->peerId(), "injected");
  // The refused Syn made no connection: the listener holds nothing more.
  EXPECT_EQ((*l)->accept(Deadline::afterMs(0)).status().code(), StatusCode::kDeadlineExceeded);
}

// A connection accepted, whose SynAck was lost, after its listener was closed (Communicator
// closes it right after its last accept): the client's repeated Syn gets the same SynAck. It
// got a reset ("nobody listens at that address"), the connect failed at its deadline, and the
// accepted side died later of silence. The client loses half of what it receives here.
TEST_F(DpdkTransportTest, ARepeatedSynAfterItsListenerClosedStillGetsItsSynAck) {
  serverDropRate_ = 0;
  start(0.5);
  if (IsSkipped()) return;
  for (int i = 0; i < 12; ++i) {
    auto l = server_->listen({});
    ASSERT_TRUE(l.ok()) << l.status();
    std::unique_ptr<Listener> listener = std::move(l).value();
    const std::string address = listener->address();
    std::shared_ptr<Connection> accepted;
    std::thread acceptor([&] {
      auto a = listener->accept(testDeadline());
      if (a.ok()) accepted = *a;
      listener.reset();  // closed as soon as it has accepted
    });
    auto c =
        client_->connect(address, {.localId = "c" + std::to_string(i)}, Deadline::afterMs(3000));
    acceptor.join();
    ASSERT_TRUE(c.ok()) << "connect " << i << ": " << c.status();
    ASSERT_NE(accepted, nullptr);
    ConnPair p{*c, accepted};
    roundTrip(p, 2000, 1, static_cast<uint32_t>(i));
  }
}

// A send refused for its arguments, posted behind one still being framed (4 MiB to a peer that
// reads nothing yet: more than the 1024-frame window), completes after it, in posting order. It
// completed at once, before the earlier send's callback.
TEST_F(DpdkTransportTest, ARefusedSendCompletesInItsTurn) {
  start();
  if (IsSkipped()) return;
  const auto big = pattern(4u << 20, 5);
  Recorder sent;
  pair_.client->send(wire::Header{}, big.data(), big.size(), sent.sendCb(0));
  pair_.client->send(wire::Header{}, nullptr, 10, sent.sendCb(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the window fills
  std::vector<uint8_t> dst(big.size());
  Recorder got;
  pair_.server->recv(dst.data(), dst.size(), got.recvCb());
  ASSERT_TRUE(sent.wait(2));
  ASSERT_TRUE(got.wait(1));
  EXPECT_EQ(sent.order(), (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(sent.statuses()[0].ok()) << sent.statuses()[0];
  EXPECT_EQ(sent.statuses()[1].code(), StatusCode::kInvalidArgument) << sent.statuses()[1];
  EXPECT_TRUE(dst == big);
  roundTrip(pair_, 1000, 1, 6);  // the connection still works
}

TEST_F(DpdkTransportTest, ManyConnectionsInterleaved) {
  start();
  if (IsSkipped()) return;
  constexpr int kConns = 16;
  std::vector<ConnPair> pairs;
  for (int i = 0; i < kConns; ++i) {
    auto c = client_->connect(listener_->address(), {.localId = "c" + std::to_string(i)},
                              testDeadline());
    ASSERT_TRUE(c.ok()) << c.status();
    auto a = listener_->accept(testDeadline());
    ASSERT_TRUE(a.ok()) << a.status();
    pairs.push_back({*c, *a});
  }
  Recorder rec;
  std::vector<std::vector<uint8_t>> bufs(kConns, std::vector<uint8_t>(20000));
  const auto src = pattern(20000, 4);
  for (int i = 0; i < kConns; ++i) {
    EXPECT_EQ(pairs[i].server->peerId(), "c" + std::to_string(i));
    pairs[i].server->recv(bufs[i].data(), bufs[i].size(), rec.recvCb(i));
    pairs[i].client->send(wire::Header{}, src.data(), src.size(), rec.sendCb(i));
  }
  ASSERT_TRUE(rec.wait(2 * kConns));
  for (const auto& s : rec.statuses()) EXPECT_TRUE(s.ok()) << s;
  for (const auto& b : bufs) EXPECT_TRUE(b == src);
}

TEST_F(DpdkTransportTest, ContextJoinCancelsAndLaterOperationsStillComplete) {
  start();
  if (IsSkipped()) return;
  std::vector<uint8_t> buf(10);
  Recorder rec;
  pair_.server->recv(buf.data(), buf.size(), rec.recvCb());
  server_->join();
  ASSERT_TRUE(rec.wait(1));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kCancelled) << rec.statuses()[0];
  EXPECT_FALSE(server_->isViable());
  Recorder later;
  {
    InsideCall guard;
    pair_.server->send(wire::Header{}, buf.data(), buf.size(), later.sendCb());
  }
  ASSERT_TRUE(later.wait(1));
  EXPECT_FALSE(later.statuses()[0].ok());
  EXPECT_EQ(later.inlineCalls(), 0);
  EXPECT_EQ(server_->listen({}).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cofab::transport::testing
