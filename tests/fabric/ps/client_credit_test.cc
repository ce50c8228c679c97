// PushPullClient's credit queue (ClientOptions::credits) against a hand-driven daemon on a tcp
// socket that grants a window of one chunk: chunks of an operation that fails while they wait
// for credit leave the queue with it. Their entries used to stay: an operation pushed again
// with the same (key, iteration) then had each chunk sent twice (by the stale entry and by its
// own), and the second send's credit was never returned, so the daemon's window stayed short
// for good.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "fabric/ps/ps_protocol.h"
#include "fabric/ps/push_pull.h"
#include "tests/fabric/ps/hand_daemons.h"
#include "tests/fabric/ps/raw_messages.h"

namespace cofab::ps {
namespace {

using cofab::ps::testing::Message;
using cofab::ps::testing::recvOne;
using transport::Connection;

constexpr size_t kChunkBytes = 1024;

void sendControl(Connection& conn, ControlOp op, const wire::Header& about,
                 std::vector<uint8_t> payload) {
  auto body = std::make_shared<std::vector<uint8_t>>(std::move(payload));
  conn.send(controlHeader(op, about), body->data(), body->size(), [body](const Status&) {});
}

void sendResult(Connection& conn, const wire::Header& push, size_t bytes) {
  wire::Header r;
  r.type = wire::MessageType::kPullReply;
  r.key = push.key;
  r.iteration = push.iteration;
  r.chunkIndex = push.chunkIndex;
  r.chunkCount = push.chunkCount;
  auto body = std::make_shared<std::vector<uint8_t>>(bytes, 0);
  conn.send(r, body->data(), body->size(), [body](const Status&) {});
}

// The next push (pings and pulls skipped).
wire::Header nextPush(Connection& conn) {
  for (;;) {
    Message m = recvOne(conn, 10000);
    EXPECT_TRUE(m.status.ok()) << m.status;
    if (!m.status.ok()) return {};
    if (m.header.type == wire::MessageType::kPush) return m.header;
  }
}

// A daemon that fails before its credit grant (its connection closes) fails connect() at once,
// naming it. The wait for the grants was not woken by the failure: connect() slept to its
// deadline and then blamed the daemon's configuration ("sent no credit grant").
TEST(PushPullClientCredit, ADaemonLostBeforeItsGrantFailsConnectAtOnce) {
  ClientOptions o;
  o.chunkBytes = kChunkBytes;
  o.credits = 1;
  o.connectTimeoutMs = 20000;
  testing::HandDaemons hand;
  const Status s = hand.start(1, o, [](testing::HandDaemons& h) { h.daemons[0]->close(); });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;  // DeadlineExceeded after 20 s before
  EXPECT_EQ(s.message().find("sent no credit grant"), std::string::npos) << s;
  EXPECT_NE(s.message().find("aggregator 0"), std::string::npos) << s;
}

// Every daemon that sent no grant by connect's deadline is named, not only the first one the
// wait was on (the others, granted or not, went unmentioned).
TEST(PushPullClientCredit, TheGrantTimeoutNamesEveryDaemonThatSentNone) {
  ClientOptions o;
  o.chunkBytes = kChunkBytes;
  o.credits = 1;
  o.connectTimeoutMs = 1000;
  testing::HandDaemons hand;
  const Status s = hand.start(3, o, [](testing::HandDaemons& h) {
    std::vector<uint8_t> window(8, 0);
    window[1] = kChunkBytes >> 8;
    sendControl(*h.daemons[1], ControlOp::kCredit, wire::Header{}, window);
  });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("aggregator 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("aggregator 2"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("aggregator 1"), std::string::npos) << s;
}

TEST(PushPullClientCredit, ChunksOfAFailedOperationLeaveTheCreditQueue) {
  ClientOptions o;
  o.chunkBytes = kChunkBytes;
  o.credits = 1;
  o.connectTimeoutMs = 10000;
  testing::HandDaemons hand;
  // connect() waits for the grant: a window of one chunk (1024, little-endian).
  ASSERT_TRUE(hand.start(1, o, [](testing::HandDaemons& h) {
                    std::vector<uint8_t> window(8, 0);
                    window[1] = kChunkBytes >> 8;
                    sendControl(*h.daemons[0], ControlOp::kCredit, wire::Header{}, window);
                  }).ok());
  auto& client = hand.client;
  Connection& daemon = *hand.daemons[0];
  auto view = [](std::vector<float>& v) { return TensorView(v.data(), v.size(), DType::kF32); };
  const size_t perChunk = kChunkBytes / sizeof(float);

  // B goes out and holds the whole window; C and A (two chunks) wait for credit behind it.
  std::vector<float> b(perChunk, 1), c(perChunk, 1), a1(2 * perChunk, 1), out(2 * perChunk);
  std::vector<float> outB(perChunk), outC(perChunk);
  PushPullHandle hb = client->pushPull(2, view(b), view(outB));
  const wire::Header pushB = nextPush(daemon);
  ASSERT_EQ(pushB.key, 2u);
  PushPullHandle hc = client->pushPull(3, view(c), view(outC));
  PushPullHandle ha = client->pushPull(1, view(a1), view(out), {.iteration = 0});
  // A result of the wrong size for A's chunk 0 fails A while its chunks wait for credit.
  wire::Header aboutA;
  aboutA.key = 1;
  aboutA.iteration = 0;
  aboutA.chunkIndex = 0;
  aboutA.chunkCount = 2;
  sendResult(daemon, aboutA, 4);
  ASSERT_EQ(ha.wait(Deadline::afterMs(10000)).code(), StatusCode::kDataLoss);

  // A again, same iteration; then B's ack and result return the credit.
  PushPullHandle again = client->pushPull(1, view(a1), view(out), {.iteration = 0});
  sendControl(daemon, ControlOp::kAck, pushB, {});
  sendResult(daemon, pushB, kChunkBytes);
  ASSERT_TRUE(hb.wait(Deadline::afterMs(10000)).ok());
  // Each later push is answered at once (ack and result), which returns its credit.
  std::map<std::pair<uint64_t, uint32_t>, int> seen;
  for (int i = 0; i < 3; ++i) {  // C, then A's two chunks
    const wire::Header p = nextPush(daemon);
    seen[{p.key, p.chunkIndex}]++;
    sendControl(daemon, ControlOp::kAck, p, {});
    sendResult(daemon, p, kChunkBytes);
  }
  EXPECT_TRUE(hc.wait(Deadline::afterMs(10000)).ok());
  EXPECT_TRUE(again.wait(Deadline::afterMs(10000)).ok());
  // Anything sent twice arrives before this op's push (one connection, sends in order); and
  // with credit leaked, this push would never be sent at all.
  std::vector<float> d(perChunk, 1), outD(perChunk);
  PushPullHandle hd = client->pushPull(4, view(d), view(outD));
  for (;;) {
    const wire::Header p = nextPush(daemon);
    if (p.key == 0 && p.type != wire::MessageType::kPush) break;  // no push came
    if (p.key == 4) {
      sendControl(daemon, ControlOp::kAck, p, {});
      sendResult(daemon, p, kChunkBytes);
      break;
    }
    seen[{p.key, p.chunkIndex}]++;
  }
  EXPECT_TRUE(hd.wait(Deadline::afterMs(10000)).ok());
  EXPECT_EQ(seen[std::make_pair(uint64_t{1}, uint32_t{0})], 1);
  EXPECT_EQ(seen[std::make_pair(uint64_t{1}, uint32_t{1})], 1);
  EXPECT_EQ(seen[std::make_pair(uint64_t{3}, uint32_t{0})], 1);
}

}  // namespace
}  // namespace cofab::ps
