// PushPullClient::waitAll() reports every failure of the operations started before it, once:
// also those of operations that had already left the client's list of unfinished ones (every
// pushPull drops the finished ones) or never entered it (refused at the start). A hand-driven
// daemon on a tcp socket rejects key 1 and answers every other push with its own payload.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "fabric/ps/ps_protocol.h"
#include "fabric/ps/push_pull.h"
#include "tests/fabric/ps/hand_daemons.h"

namespace cofab::ps {
namespace {

using transport::Connection;

constexpr uint64_t kRejectedKey = 1;

void serve(const std::shared_ptr<Connection>& conn) {
  conn->recvOwned([conn](const Status& s, const wire::Header& h, std::vector<uint8_t>&& p) {
    if (!s.ok()) return;
    if (h.type == wire::MessageType::kPush) {
      wire::Header r = h;
      auto body = std::make_shared<std::vector<uint8_t>>();
      if (h.key == kRejectedKey) {
        r = wire::Header{};  // a reject names the chunk and nothing else
        r.type = wire::MessageType::kControl;
        r.opcode = static_cast<uint8_t>(ControlOp::kReject);
        r.key = h.key;
        r.iteration = h.iteration;
        r.chunkIndex = h.chunkIndex;
        r.chunkCount = h.chunkCount;
        body->push_back(static_cast<uint8_t>(RejectReason::kWrongSize));
        const std::string why = "test daemon refuses key 1";
        body->insert(body->end(), why.begin(), why.end());
      } else {
        r.type = wire::MessageType::kPullReply;
        r.opcode = 0;
        *body = std::move(p);
      }
      conn->send(r, body->data(), body->size(), [body](const Status&) {});
    }
    serve(conn);
  });
}

TEST(PushPullClientWaitAll, ReportsAFailureOfAnOperationTheClientNoLongerTracksOnce) {
  ClientOptions o;
  o.chunkBytes = 1 << 20;
  o.connectTimeoutMs = 10000;
  testing::HandDaemons hand;
  ASSERT_TRUE(hand.start(1, o).ok());
  auto& client = hand.client;
  serve(hand.daemons[0]);
  std::vector<float> in(256, 1.0f), out(256), out2(256);
  auto view = [](std::vector<float>& v) { return TensorView(v.data(), v.size(), DType::kF32); };

  // Key 1 fails; the pushPull of key 2 after it drops the finished op from the client's list.
  const Status rejected = client->pushPull(kRejectedKey, view(in), view(out))
                              .wait(Deadline::afterMs(10000));
  ASSERT_FALSE(rejected.ok());
  ASSERT_TRUE(client->pushPull(2, view(in), view(out2)).wait(Deadline::afterMs(10000)).ok());
  const Status all = client->waitAll(Deadline::afterMs(10000));
  EXPECT_EQ(all.code(), rejected.code()) << all;
  EXPECT_NE(all.message().find("refuses key 1"), std::string::npos) << all;
  EXPECT_TRUE(client->waitAll(Deadline::afterMs(10000)).ok()) << "reported twice";

  // Refused at the start (a dtype push-pull cannot reduce): never in the list at all.
  std::vector<int32_t> ints(16, 1);
  const TensorView iv(ints.data(), ints.size(), DType::kI32);
  const Status bad = client->pushPull(3, iv, iv).wait(Deadline::afterMs(10000));
  ASSERT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad;
  ASSERT_TRUE(client->pushPull(4, view(in), view(out2)).wait(Deadline::afterMs(10000)).ok());
  EXPECT_EQ(client->waitAll(Deadline::afterMs(10000)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(client->waitAll(Deadline::afterMs(10000)).ok());

  // Two failures before one waitAll(): it returns one, and the next call, after another
  // pushPull dropped the second from the client's list, does not return the other.
  PushPullHandle f1 = client->pushPull(kRejectedKey, view(in), view(out));
  PushPullHandle f2 = client->pushPull(kRejectedKey, view(in), view(out2));
  ASSERT_FALSE(f1.wait(Deadline::afterMs(10000)).ok());
  ASSERT_FALSE(f2.wait(Deadline::afterMs(10000)).ok());
  EXPECT_FALSE(client->waitAll(Deadline::afterMs(10000)).ok());
  ASSERT_TRUE(client->pushPull(6, view(in), view(out2)).wait(Deadline::afterMs(10000)).ok());
  EXPECT_TRUE(client->waitAll(Deadline::afterMs(10000)).ok()) << "an old failure came back";

  // An op waitAll() itself waited for and saw fail is not reported again by the next one.
  PushPullHandle failing = client->pushPull(kRejectedKey, view(in), view(out));
  EXPECT_FALSE(client->waitAll(Deadline::afterMs(10000)).ok());
  ASSERT_TRUE(client->pushPull(5, view(in), view(out2)).wait(Deadline::afterMs(10000)).ok());
  EXPECT_TRUE(client->waitAll(Deadline::afterMs(10000)).ok()) << "reported twice";
  (void)failing;
}

}  // namespace
}  // namespace cofab::ps
