// PushPullClient lends the caller's `in` and `out` to the transport only while an operation
// runs: a handle that completes (even with an error, and however early) never leaves a send
// still reading `in` or a receive still writing `out`. Two hand-driven daemons on real tcp
// sockets: one rejects every push at once, the other stops reading, so pushes to it stay queued
// in the transport when the reject arrives.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fabric/ps/placement.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/ps/push_pull.h"
#include "fabric/transport/inproc_pipe.h"
#include "fabric/transport/registry.h"
#include "tests/fabric/ps/raw_messages.h"

namespace cofab::ps {
namespace {

using transport::Connection;

using cofab::ps::testing::Message;
using cofab::ps::testing::recvOne;

// Answers every push on `conn` with a reject, from the context's I/O thread, until it closes.
void rejectEveryPush(const std::shared_ptr<Connection>& conn) {
  conn->recvOwned([conn](const Status& s, const wire::Header& h, std::vector<uint8_t>&&) {
    if (!s.ok()) return;
    if (h.type == wire::MessageType::kPush) {
      wire::Header r;
      r.type = wire::MessageType::kControl;
      r.opcode = static_cast<uint8_t>(ControlOp::kReject);
      r.key = h.key;
      r.iteration = h.iteration;
      r.chunkIndex = h.chunkIndex;
      r.chunkCount = h.chunkCount;
      auto text = std::make_shared<std::vector<uint8_t>>();
      text->push_back(static_cast<uint8_t>(RejectReason::kDraining));
      const std::string why = "test daemon refuses everything";
      text->insert(text->end(), why.begin(), why.end());
      conn->send(r, text->data(), text->size(), [text](const Status&) {});
    }
    rejectEveryPush(conn);
  });
}

TEST(PushPullClientMemory, AnEarlyRejectWaitsForQueuedSendsBeforeHandingInBack) {
  auto ctx = transport::Registry::create("tcp", {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto l0 = (*ctx)->listen({});
  auto l1 = (*ctx)->listen({});
  ASSERT_TRUE(l0.ok() && l1.ok());
  ClientOptions o;
  o.serverAddresses = {(*l0)->address(), (*l1)->address()};
  o.chunkBytes = 1 << 20;
  o.connectTimeoutMs = 10000;
  auto connecting =
      std::async(std::launch::async, [&] { return PushPullClient::connect(0, 1, o); });
  auto a0 = (*l0)->accept(Deadline::afterMs(10000));
  auto a1 = (*l1)->accept(Deadline::afterMs(10000));
  ASSERT_TRUE(a0.ok() && a1.ok());
  auto client = connecting.get();
  ASSERT_TRUE(client.ok()) << client.status();
  rejectEveryPush(*a0);

  // 64 MiB in 64 chunks, about half of them for daemon 1: far more than its socket buffers
  // take while it does not read.
  const uint64_t key = 11;
  std::vector<float> in(16u << 20), out(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 1000003);
  const ChunkLayout layout = chunkLayout(in.size(), sizeof(float), o.chunkBytes);
  uint32_t toDaemon1 = 0;
  for (uint32_t c = 0; c < layout.chunkCount; ++c) toDaemon1 += primaryServer(key, c, 2) == 1;
  ASSERT_GT(toDaemon1, 8u);

  PushPullHandle h = (*client)->pushPull(key, TensorView(in.data(), in.size(), DType::kF32),
                                         TensorView(out.data(), out.size(), DType::kF32),
                                         {.delivery = Delivery::kPull});
  // The reject is back within milliseconds, but pushes to daemon 1 still read `in`: the
  // handle must not complete yet.
  const Status early = h.wait(Deadline::afterMs(500));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early;
  // ... and its timeout says what it waits for: the sends, not chunks "missing" at the daemon
  // that already rejected them.
  EXPECT_NE(early.message().find("test daemon refuses everything"), std::string::npos) << early;
  EXPECT_NE(early.message().find("still waiting for"), std::string::npos) << early;
  EXPECT_EQ(early.message().find("still missing"), std::string::npos) << early;
  // ... and whose connection holds them: daemon 1's, which stopped reading.
  EXPECT_NE(early.message().find("on aggregator 1 ("), std::string::npos) << early;

  // Daemon 1 reads again: the queued pushes go out, the handle completes with the reject.
  std::map<uint32_t, std::vector<uint8_t>> got;
  auto reader = std::async(std::launch::async, [&] {
    while (got.size() < toDaemon1) {
      Message m = recvOne(**a1, 20000);
      if (!m.status.ok()) return m.status;
      if (m.header.type == wire::MessageType::kPush)
        got[m.header.chunkIndex] = std::move(m.payload);
    }
    return OkStatus();
  });
  const Status final = h.wait(Deadline::afterMs(30000));
  EXPECT_EQ(final.code(), StatusCode::kFailedPrecondition) << final;
  EXPECT_NE(final.message().find("test daemon refuses everything"), std::string::npos) << final;
  // The caller owns `in` again: what daemon 1 still reads must be what was pushed before.
  std::vector<float> original = in;
  std::fill(in.begin(), in.end(), -1.0f);
  ASSERT_TRUE(reader.get().ok());
  for (const auto& [chunk, bytes] : got) {
    const size_t first = static_cast<size_t>(chunk) * layout.elementsPerChunk;
    ASSERT_EQ(bytes.size() % sizeof(float), 0u);
    EXPECT_EQ(std::memcmp(bytes.data(), original.data() + first, bytes.size()), 0)
        << "chunk " << chunk << " reached daemon 1 altered";
  }
  (*client)->close();
  (*ctx)->close();
  (*ctx)->join();
}

// A second pushPull of a (key, iteration) whose first is still in flight fails at once, and
// sends nothing: a chunk it had already sent would stay behind, its result written into the
// `out` that the failed handle just handed back.
TEST(PushPullClientMemory, ARepeatedKeyAndIterationIsRefusedBeforeAnyChunkGoesOut) {
  auto ctx = transport::Registry::create("tcp", {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto l = (*ctx)->listen({});
  ASSERT_TRUE(l.ok());
  ClientOptions o;
  o.serverAddresses = {(*l)->address()};
  o.chunkBytes = 1024;
  auto connecting =
      std::async(std::launch::async, [&] { return PushPullClient::connect(0, 1, o); });
  auto a = (*l)->accept(Deadline::afterMs(10000));
  ASSERT_TRUE(a.ok()) << a.status();
  auto client = connecting.get();
  ASSERT_TRUE(client.ok()) << client.status();

  // Op A: two chunks; the daemon answers chunk 0 only, so chunk 1 stays in flight.
  const uint64_t key = 5;
  std::vector<float> in(512, 1.0f), out(512, 0.0f);
  PushPullHandle first = (*client)->pushPull(key, TensorView(in.data(), in.size(), DType::kF32),
                                             TensorView(out.data(), out.size(), DType::kF32),
                                             {.delivery = Delivery::kPull, .iteration = 0});
  int pushesOfChunk0 = 0;
  while (pushesOfChunk0 == 0) {
    Message m = recvOne(**a, 10000);
    ASSERT_TRUE(m.status.ok()) << m.status;
    if (m.header.type != wire::MessageType::kPush || m.header.chunkIndex != 0) continue;
    ++pushesOfChunk0;
    wire::Header r = m.header;
    r.type = wire::MessageType::kPullReply;
    r.opcode = 0;
    auto body = std::make_shared<std::vector<uint8_t>>(std::move(m.payload));
    (*a)->send(r, body->data(), body->size(), [body](const Status&) {});
  }

  // Op B repeats key 5, iteration 0 while A's chunk 1 is in flight, with one chunk only: once
  // A's chunk 0 is answered (its bytes counted in), only a check on the (key, iteration) itself
  // refuses it.
  const Deadline answered = Deadline::afterMs(10000);
  while ((*client)->stats().bytesIn < 1024 && !answered.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ((*client)->stats().bytesIn, 1024u);
  std::vector<float> in2(256, 2.0f), out2(256, -7.0f);
  PushPullHandle second = (*client)->pushPull(key, TensorView(in2.data(), in2.size(), DType::kF32),
                                              TensorView(out2.data(), out2.size(), DType::kF32),
                                              {.delivery = Delivery::kPull, .iteration = 0});
  const Status s = second.wait(Deadline::afterMs(10000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("already in flight"), std::string::npos) << s;

  // Whatever B sent would arrive before this op's push (one connection, sends in order).
  std::vector<float> in3(256, 3.0f), out3(256);
  PushPullHandle marker = (*client)->pushPull(
      key + 1, TensorView(in3.data(), in3.size(), DType::kF32),
      TensorView(out3.data(), out3.size(), DType::kF32), {.delivery = Delivery::kPull});
  for (;;) {
    Message m = recvOne(**a, 10000);
    ASSERT_TRUE(m.status.ok()) << m.status;
    if (m.header.type != wire::MessageType::kPush) continue;
    if (m.header.key == key + 1) break;
    EXPECT_FALSE(m.header.key == key && m.header.chunkIndex == 0)
        << "the refused op sent chunk 0 again";
  }
  EXPECT_EQ(out2, std::vector<float>(256, -7.0f));
  (*client)->close();
  (*ctx)->close();
  (*ctx)->join();
  (void)first;
  (void)marker;
}

// `in` and `out` partially overlapping: chunk c's result would land on chunk c + 1's input
// before that is sent (or resent after a failover). Refused before anything is sent; the same
// buffer for both (in place) still works.
TEST(PushPullClientMemory, PartiallyOverlappingInAndOutAreRefused) {
  auto ctx = transport::Registry::create("tcp", {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto l = (*ctx)->listen({});
  ASSERT_TRUE(l.ok());
  ClientOptions o;
  o.serverAddresses = {(*l)->address()};
  o.chunkBytes = 1024;
  auto connecting =
      std::async(std::launch::async, [&] { return PushPullClient::connect(0, 1, o); });
  auto a = (*l)->accept(Deadline::afterMs(10000));
  ASSERT_TRUE(a.ok()) << a.status();
  auto client = connecting.get();
  ASSERT_TRUE(client.ok()) << client.status();

  std::vector<float> buf(513, 1.0f);
  PushPullHandle shifted = (*client)->pushPull(3, TensorView(buf.data(), 512, DType::kF32),
                                               TensorView(buf.data() + 1, 512, DType::kF32),
                                               {.delivery = Delivery::kPull});
  const Status s = shifted.wait(Deadline::afterMs(10000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s;

  // In place goes out (and is the first push the daemon sees).
  PushPullHandle inPlace =
      (*client)->pushPull(4, TensorView(buf.data(), 512, DType::kF32),
                          TensorView(buf.data(), 512, DType::kF32), {.delivery = Delivery::kPull});
  Message m = recvOne(**a, 10000);
  ASSERT_TRUE(m.status.ok()) << m.status;
  EXPECT_EQ(m.header.type, wire::MessageType::kPush);
  EXPECT_EQ(m.header.key, 4u) << "the refused op sent a chunk";
  (*client)->close();
  EXPECT_EQ(inPlace.wait(Deadline::afterMs(10000)).code(), StatusCode::kCancelled);
  (*ctx)->close();
  (*ctx)->join();
}

// A pushPull that comes while close() is under way (here: held in its goodbye, whose delivery
// the test holds up) is refused at once. Accepted, its sends would complete after close()
// returned, on a client the caller may already have destroyed.
TEST(PushPullClientMemory, APushPullDuringCloseIsRefusedAtOnce) {
  transport::PipeEnds ends = transport::makeInProcessPipe("worker 0", "agg 0");
  ClientOptions o;
  o.serverAddresses = {"in-process daemon 0"};
  o.inProcess = {{0, ends.a}};
  auto client = PushPullClient::connect(0, 1, o);
  ASSERT_TRUE(client.ok()) << client.status();

  // The daemon's end takes the goodbye and keeps the pipe's thread (which runs every callback
  // of both ends) until the test is done: close() cannot get past its goodbye and joins.
  std::promise<void> goodbyeSeen, release;
  std::shared_future<void> released = release.get_future().share();
  ends.b->recvOwned([&goodbyeSeen, released](const Status& st, const wire::Header& h,
                                             std::vector<uint8_t>&&) {
    if (st.ok() && h.type == wire::MessageType::kGoodbye) {
      goodbyeSeen.set_value();
      released.wait();
    }
  });
  auto closing = std::async(std::launch::async, [&] { (*client)->close(); });
  ASSERT_EQ(goodbyeSeen.get_future().wait_for(std::chrono::seconds(10)),
            std::future_status::ready);

  std::vector<float> in(256, 1.0f), out(256, 0.0f);
  PushPullHandle h = (*client)->pushPull(9, TensorView(in.data(), in.size(), DType::kF32),
                                         TensorView(out.data(), out.size(), DType::kF32),
                                         {.delivery = Delivery::kPull});
  EXPECT_TRUE(h.test()) << "accepted while the client was closing";
  const Status s = h.status();
  release.set_value();
  closing.get();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s;
  ends.b->close();
  ends.b->join();
}

}  // namespace
}  // namespace cofab::ps
