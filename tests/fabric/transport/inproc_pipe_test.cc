// The in-process pipe (fabric/transport/inproc_pipe.h): one copy from the sender's slices into
// posted, routed or owned memory, the callback rules, close and join.
#include <cstring>

#include "fabric/transport/inproc_pipe.h"
#include "tests/fabric/transport/transport_test_util.h"

namespace cofab::transport::testing {
namespace {

struct OwnedResult {
  Recorder rec;
  std::vector<uint8_t> payload;
  RecvOwnedCallback cb() {
    return [this](const Status& s, const wire::Header& h, std::vector<uint8_t>&& p) {
      payload = std::move(p);
      rec.record(s, h);
    };
  }
};

TEST(InProcessPipeTest, PostedRoutedAndOwnedReceivesGetTheBytesInOrder) {
  PipeEnds p = makeInProcessPipe("worker 1", "agg 0");
  EXPECT_EQ(p.a->peerId(), "agg 0");
  EXPECT_EQ(p.b->peerId(), "worker 1");
  const auto m1 = pattern(1000003, 1);
  const auto m2 = pattern(4097, 2);
  const auto m3 = pattern(77, 3);
  std::vector<uint8_t> posted(m1.size(), 0xAA);
  std::vector<uint8_t> routedDst(m2.size(), 0xAA);
  Recorder got1;
  OwnedResult got2, got3;
  int routeCalls = 0;
  Recorder sent;
  {
    InsideCall inside;
    p.b->recv(posted.data(), posted.size(), got1.recvCb());
    p.b->recvRouted(
        [&](const wire::Header& h) {
          ++routeCalls;
          EXPECT_EQ(h.key, 2u);
          EXPECT_EQ(h.payloadLength, m2.size());
          return MutableSlice{routedDst.data(), routedDst.size(), nullptr};
        },
        got2.cb());
    p.b->recvRouted([](const wire::Header&) { return MutableSlice{}; }, got3.cb());
    // m1 in three slices: the copy gathers them.
    const ConstSlice s1[] = {
        {m1.data(), 10}, {m1.data() + 10, 500000}, {m1.data() + 500010, m1.size() - 500010}};
    wire::Header h;
    h.key = 1;
    p.a->send(h, ConstSlices(s1), sent.sendCb(1));
    h.key = 2;
    p.a->send(h, m2.data(), m2.size(), sent.sendCb(2));
    h.key = 3;
    p.a->send(h, m3.data(), m3.size(), sent.sendCb(3));
  }
  ASSERT_TRUE(sent.wait(3));
  ASSERT_TRUE(got1.wait(1));
  ASSERT_TRUE(got2.rec.wait(1));
  ASSERT_TRUE(got3.rec.wait(1));
  EXPECT_EQ(sent.order(), (std::vector<size_t>{1, 2, 3}));
  for (const Status& s : sent.statuses()) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(got1.statuses()[0].ok()) << got1.statuses()[0];
  EXPECT_EQ(got1.headers()[0].key, 1u);
  EXPECT_EQ(got1.headers()[0].payloadLength, m1.size());
  EXPECT_EQ(posted, m1);
  EXPECT_TRUE(got2.rec.statuses()[0].ok());
  EXPECT_EQ(routeCalls, 1);
  EXPECT_TRUE(got2.payload.empty()) << "a routed payload is not also delivered as a vector";
  EXPECT_EQ(routedDst, m2);
  EXPECT_TRUE(got3.rec.statuses()[0].ok());
  EXPECT_EQ(got3.payload, m3) << "a null route falls back to an owned vector";
  EXPECT_EQ(
      sent.inlineCalls() + got1.inlineCalls() + got2.rec.inlineCalls() + got3.rec.inlineCalls(), 0);
  p.a->close();
  p.b->close();
  p.a->join();
  p.b->join();
}

TEST(InProcessPipeTest, SizeMismatchFailsTheReceiveAndTheConnection) {
  PipeEnds p = makeInProcessPipe("a", "b");
  std::vector<uint8_t> small(10);
  std::vector<uint8_t> payload(11, 1);
  OwnedResult got;
  Recorder sent;
  p.b->recvRouted(
      [&](const wire::Header&) {
        return MutableSlice{small.data(), small.size()};
      },
      got.cb());
  p.a->send(wire::Header{}, payload.data(), payload.size(), sent.sendCb());
  ASSERT_TRUE(got.rec.wait(1));
  EXPECT_EQ(got.rec.statuses()[0].code(), StatusCode::kInvalidArgument) << got.rec.statuses()[0];
  EXPECT_NE(got.rec.statuses()[0].message().find("11 bytes"), std::string::npos);
  ASSERT_TRUE(sent.wait(1));
  // Both ends are now failed for good.
  Recorder later;
  p.a->send(wire::Header{}, payload.data(), payload.size(), later.sendCb());
  ASSERT_TRUE(later.wait(1));
  EXPECT_EQ(later.statuses()[0].code(), StatusCode::kRemoteError) << later.statuses()[0];
  EXPECT_EQ(p.b->status().code(), StatusCode::kInvalidArgument);
}

// As on every transport (TransportContractTest.AFailedReceiveIsStickyInItsOwnCallback): inside
// the failing receive's callback, status() already says the error. The pipe recorded it only
// after the callback had run.
TEST(InProcessPipeTest, AFailedReceiveIsStickyInItsOwnCallback) {
  PipeEnds p = makeInProcessPipe("a", "b");
  std::vector<uint8_t> small(10);
  std::vector<uint8_t> payload(11, 1);
  Status seen = OkStatus();
  Recorder got;
  Recorder sent;
  Connection* b = p.b.get();
  p.b->recv(small.data(), small.size(), [&](const Status& st, const wire::Header&) {
    seen = b->status();
    got.record(st);
  });
  p.a->send(wire::Header{}, payload.data(), payload.size(), sent.sendCb());
  ASSERT_TRUE(got.wait(1));
  ASSERT_TRUE(sent.wait(1));
  EXPECT_EQ(got.statuses()[0].code(), StatusCode::kInvalidArgument) << got.statuses()[0];
  EXPECT_EQ(seen.code(), StatusCode::kInvalidArgument) << "status() inside the callback: " << seen;
}

TEST(InProcessPipeTest, CloseCancelsHereAndIsARemoteErrorThere) {
  PipeEnds p = makeInProcessPipe("worker 0", "agg 0");
  Recorder mine, theirs;
  std::vector<uint8_t> buf(8);
  p.a->recv(buf.data(), buf.size(), mine.recvCb());
  p.b->recv(buf.data(), buf.size(), theirs.recvCb());
  p.a->close();
  p.a->join();  // after join no callback of `a` is pending
  EXPECT_EQ(mine.count(), 1u);
  EXPECT_EQ(mine.statuses()[0].code(), StatusCode::kCancelled) << mine.statuses()[0];
  ASSERT_TRUE(theirs.wait(1));
  EXPECT_EQ(theirs.statuses()[0].code(), StatusCode::kRemoteError) << theirs.statuses()[0];
  EXPECT_NE(theirs.statuses()[0].message().find("worker 0"), std::string::npos)
      << theirs.statuses()[0];
  Recorder after;
  p.a->send(wire::Header{}, nullptr, 0, after.sendCb());
  ASSERT_TRUE(after.wait(1));
  EXPECT_EQ(after.statuses()[0].code(), StatusCode::kFailedPrecondition) << after.statuses()[0];
  p.b->close();
  p.b->join();
}

TEST(InProcessPipeTest, DroppingBothEndsWithOperationsPendingCompletesThem) {
  Recorder got;
  std::vector<uint8_t> buf(8);
  {
    PipeEnds p = makeInProcessPipe("a", "b");
    p.b->recv(buf.data(), buf.size(), got.recvCb());
  }
  ASSERT_TRUE(got.wait(1));
  EXPECT_FALSE(got.statuses()[0].ok());
}

}  // namespace
}  // namespace cofab::transport::testing
