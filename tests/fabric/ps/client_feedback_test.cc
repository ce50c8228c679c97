// PushPullClient's 1-bit error feedback (docs/COMPRESSION.md) against a hand-driven daemon on a
// tcp socket that answers each push with its own payload as the result (a one-worker "sum"): a
// pushPull that is refused must not move the key's residual, so the rounds after it are encoded,
// and come back, bit for bit as if it had never been called.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <vector>

#include "fabric/compress/codec.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/ps/push_pull.h"
#include "fabric/transport/registry.h"
#include "tests/fabric/ps/raw_messages.h"

namespace cofab::ps {
namespace {

using transport::Connection;

constexpr size_t kCount = 1000, kBlock = 64;

using cofab::ps::testing::Message;
using cofab::ps::testing::recvOne;

// The next push on `conn` (pulls and pings skipped), which must be (key, iteration, chunk 0).
void awaitPush(Connection& conn, uint64_t key, uint64_t iteration, Message* push) {
  for (;;) {
    Message m = recvOne(conn, 10000);
    ASSERT_TRUE(m.status.ok()) << m.status;
    if (m.header.type != wire::MessageType::kPush) continue;
    ASSERT_EQ(m.header.key, key);
    ASSERT_EQ(m.header.iteration, iteration);
    ASSERT_EQ(m.header.chunkIndex, 0u);
    ASSERT_EQ(m.header.chunkCount, 1u);
    *push = std::move(m);
    return;
  }
}

// Answers `push` with its own payload as the round's result.
void answer(Connection& conn, const Message& push) {
  wire::Header r = push.header;
  r.type = wire::MessageType::kPullReply;
  r.opcode = 0;
  auto body = std::make_shared<std::vector<uint8_t>>(push.payload);
  conn.send(r, body->data(), body->size(), [body](const Status&) {});
}

std::vector<float> gradient(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.2f, 1.0f);
  std::vector<float> v(kCount);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(PushPullClientFeedback, ARefusedPushPullLeavesTheErrorFeedbackResidualAlone) {
  auto ctx = transport::Registry::create("tcp", {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto l = (*ctx)->listen({});
  ASSERT_TRUE(l.ok());
  ClientOptions o;
  o.serverAddresses = {(*l)->address()};
  o.chunkBytes = 1 << 20;  // one chunk per tensor
  o.connectTimeoutMs = 10000;
  auto connecting =
      std::async(std::launch::async, [&] { return PushPullClient::connect(0, 1, o); });
  auto a = (*l)->accept(Deadline::afterMs(10000));
  ASSERT_TRUE(a.ok()) << a.status();
  auto client = connecting.get();
  ASSERT_TRUE(client.ok()) << client.status();
  Connection& daemon = **a;
  const std::vector<float> x0 = gradient(1), x1 = gradient(2);

  // Rounds 0 and 1 of `key` (1-bit, the client's per-key residual); with `refused`, round 0 is
  // issued a second time while the first is still in flight (the daemon holds its answer).
  auto run = [&](uint64_t key, bool refused, std::vector<uint8_t>* push1,
                 std::vector<float>* result1) {
    PushPullOptions po;
    po.compression = Compression::kOneBit;
    po.compressionBlock = kBlock;
    po.iteration = 0;
    std::vector<float> in0 = x0, out0(kCount, 0.0f);
    PushPullHandle h0 = (*client)->pushPull(key, TensorView(in0.data(), kCount, DType::kF32),
                                            TensorView(out0.data(), kCount, DType::kF32), po);
    Message m0;
    ASSERT_NO_FATAL_FAILURE(awaitPush(daemon, key, 0, &m0));
    if (refused) {
      std::vector<float> again = x0, againOut(kCount, -7.0f);
      PushPullHandle r = (*client)->pushPull(key, TensorView(again.data(), kCount, DType::kF32),
                                             TensorView(againOut.data(), kCount, DType::kF32), po);
      const Status s = r.wait(Deadline::afterMs(10000));
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
      EXPECT_NE(s.message().find("already in flight"), std::string::npos) << s;
      EXPECT_EQ(againOut, std::vector<float>(kCount, -7.0f));
    }
    answer(daemon, m0);
    const Status s0 = h0.wait(Deadline::afterMs(10000));
    ASSERT_TRUE(s0.ok()) << s0;

    po.iteration = 1;
    std::vector<float> in1 = x1, out1(kCount, 0.0f);
    PushPullHandle h1 = (*client)->pushPull(key, TensorView(in1.data(), kCount, DType::kF32),
                                            TensorView(out1.data(), kCount, DType::kF32), po);
    Message m1;
    ASSERT_NO_FATAL_FAILURE(awaitPush(daemon, key, 1, &m1));
    *push1 = m1.payload;
    answer(daemon, m1);
    const Status s1 = h1.wait(Deadline::afterMs(10000));
    ASSERT_TRUE(s1.ok()) << s1;
    *result1 = std::move(out1);
  };

  std::vector<uint8_t> pushWithRefusal, pushControl;
  std::vector<float> resultWithRefusal, resultControl;
  ASSERT_NO_FATAL_FAILURE(run(5, true, &pushWithRefusal, &resultWithRefusal));
  ASSERT_NO_FATAL_FAILURE(run(6, false, &pushControl, &resultControl));  // a fresh residual

  // The control is the definition: x0 then x1 through one residual.
  std::vector<float> residual(kCount, 0.0f);
  auto encode = [&](const std::vector<float>& x) {
    std::vector<uint8_t> e(compress::compressedBytes(Compression::kOneBit, kCount, kBlock));
    compress::compress(Compression::kOneBit, x.data(), kCount, kBlock, residual.data(), e.data());
    return e;
  };
  encode(x0);
  EXPECT_EQ(pushControl, encode(x1));
  // What the refused call would have done to round 1 had it moved the residual: different
  // bytes, so the comparison below does see it.
  residual.assign(kCount, 0.0f);
  encode(x0);
  encode(x0);
  EXPECT_NE(pushControl, encode(x1));

  EXPECT_EQ(pushWithRefusal, pushControl) << "round 1 was encoded with a residual the refused "
                                             "pushPull had moved";
  ASSERT_EQ(resultWithRefusal.size(), kCount);
  ASSERT_EQ(resultControl.size(), kCount);
  EXPECT_EQ(std::memcmp(resultWithRefusal.data(), resultControl.data(), kCount * sizeof(float)), 0)
      << "round 1's result differs from the run without the refused call";
  (*client)->close();
  (*ctx)->close();
  (*ctx)->join();
}

}  // namespace
}  // namespace cofab::ps
