// ModelClient against a model-store daemon played by the test on a tcp socket: an answer that does
// not fit its request (another kind, a wrong dtype or chunk count) fails the call with DataLoss
// instead of completing it with `out` unwritten; a pull that failed partway leaves the chunks it
// never received without a base version, so apply-and-pull refuses the key and sends nothing; and
// a chunk size whose apply-pull answers would not fit in a message is refused at connect.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/param.h"
#include "fabric/ps/model_client.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/transport/registry.h"
#include "tests/fabric/ps/raw_messages.h"

namespace cofab::ps {
namespace {

using transport::Connection;

using cofab::ps::testing::Message;
using cofab::ps::testing::recvOne;

std::vector<uint8_t> floatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TensorView f32(std::vector<float>& v) { return TensorView::of(v.data(), v.size(), DType::kF32); }

// One daemon, played by the test: a ModelClient (chunks of 4 floats) connected to a listener
// whose accepted connection the test reads requests from and answers on.
class FakeModelDaemon : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ctx = transport::Registry::create("tcp", {});
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = *ctx;
    auto l = ctx_->listen({});
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
    ClientOptions o;
    o.serverAddresses = {listener_->address()};
    o.chunkBytes = 4 * sizeof(float);
    o.connectTimeoutMs = 10000;
    auto connecting = std::async(std::launch::async, [o] { return ModelClient::connect(0, 1, o); });
    auto a = listener_->accept(Deadline::afterMs(10000));
    ASSERT_TRUE(a.ok()) << a.status();
    conn_ = *a;
    auto c = connecting.get();
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  void TearDown() override {
    if (client_) client_->close();
    if (ctx_) {
      ctx_->close();
      ctx_->join();
    }
  }

  // The next control message the client sent (a model request, or ModelLeave).
  Message nextControl() {
    for (;;) {
      Message m = recvOne(*conn_, 10000);
      if (!m.status.ok() || m.header.type == wire::MessageType::kControl) return m;
    }
  }

  // Answers `request` with `op`, as the daemon does: its identity echoed, `version` in iteration.
  void answer(const wire::Header& request, ControlOp op, uint64_t version, DType dtype,
              std::vector<uint8_t> payload, uint32_t chunkCount = 0) {
    wire::Header h = controlHeader(op, request);
    h.iteration = version;
    h.dtype = dtype;
    if (chunkCount != 0) h.chunkCount = chunkCount;
    auto body = std::make_shared<std::vector<uint8_t>>(std::move(payload));
    conn_->send(h, body->data(), body->size(), [body](const Status&) {});
  }

  std::shared_ptr<transport::Context> ctx_;
  std::unique_ptr<transport::Listener> listener_;
  std::shared_ptr<Connection> conn_;
  std::unique_ptr<ModelClient> client_;
};

// A pull answered with the wrong kind, dtype or chunk count is DataLoss naming the aggregator,
// and `out` is left alone; before the fix each of these completed the pull OK (with the ModelAck
// not a byte of `out` written). The client stays usable: a proper answer then completes a pull.
TEST_F(FakeModelDaemon, APullAnsweredWithAnythingButItsValueIsDataLoss) {
  const std::vector<float> value{1, 2, 3, 4};
  struct Case {
    const char* what;
    ControlOp op;
    DType dtype;
    uint32_t chunkCount;  // 0: the request's
  };
  const Case cases[] = {
      {"a ModelAck (init's answer)", ControlOp::kModelAck, DType::kU8, 0},
      {"a ModelApplied (apply's answer)", ControlOp::kModelApplied, DType::kU8, 0},
      {"a ModelValue of dtype u8", ControlOp::kModelValue, DType::kU8, 0},
      {"a ModelValue for a key of 2 chunks", ControlOp::kModelValue, DType::kF32, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<float> out(4, -7.0f);
    auto pulling = std::async(std::launch::async,
                              [&] { return client_->pull(7, f32(out), Deadline::afterMs(10000)); });
    Message req = nextControl();
    ASSERT_TRUE(req.status.ok()) << req.status;
    ASSERT_EQ(req.header.opcode, static_cast<uint8_t>(ControlOp::kModelPull));
    std::vector<uint8_t> payload;
    if (c.op == ControlOp::kModelValue) {
      payload = floatBytes(value);
    } else if (c.op == ControlOp::kModelApplied) {
      payload.assign(kModelApplyReplyBytes, 0);
    }
    answer(req.header, c.op, 3, c.dtype, payload, c.chunkCount);
    StatusOr<uint64_t> got = pulling.get();
    EXPECT_EQ(got.status().code(), StatusCode::kDataLoss) << got.status();
    EXPECT_NE(got.status().message().find("aggregator 0"), std::string::npos) << got.status();
    EXPECT_EQ(out, std::vector<float>(4, -7.0f));
  }
  std::vector<float> out(4, -7.0f);
  auto pulling = std::async(std::launch::async,
                            [&] { return client_->pull(7, f32(out), Deadline::afterMs(10000)); });
  Message req = nextControl();
  ASSERT_TRUE(req.status.ok()) << req.status;
  answer(req.header, ControlOp::kModelValue, 3, DType::kF32, floatBytes(value));
  StatusOr<uint64_t> got = pulling.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 3u);
  EXPECT_EQ(out, value);
}

// A pull of two chunks gets chunk 0's value (version 5) and a reject for chunk 1. Before the fix
// the first answered chunk created the key's versions with zeros, so chunk 1 counted as version 0
// and apply-and-pull went out with base 0 for a chunk this client never saw. Now chunk 1 has no
// base: apply-and-pull fails with FailedPrecondition at once, and nothing reaches the daemon (the
// next message it gets is the ModelLeave sent afterwards as a marker).
TEST_F(FakeModelDaemon, AfterAPullThatFailedPartwayApplyPullRefusesTheKeyAndSendsNothing) {
  std::vector<float> out(8, 0.0f);  // two chunks of 4 floats
  auto pulling = std::async(std::launch::async,
                            [&] { return client_->pull(7, f32(out), Deadline::afterMs(10000)); });
  Message c0 = nextControl();
  Message c1 = nextControl();
  ASSERT_TRUE(c0.status.ok() && c1.status.ok()) << c0.status << " / " << c1.status;
  ASSERT_EQ(c0.header.opcode, static_cast<uint8_t>(ControlOp::kModelPull));
  ASSERT_EQ(c1.header.opcode, static_cast<uint8_t>(ControlOp::kModelPull));
  ASSERT_EQ(c0.header.chunkIndex, 0u);
  ASSERT_EQ(c1.header.chunkIndex, 1u);
  // In this order on the one connection: chunk 0's value is recorded before the reject fails
  // the pull.
  answer(c0.header, ControlOp::kModelValue, 5, DType::kF32, floatBytes({1, 2, 3, 4}));
  std::vector<uint8_t> reject{static_cast<uint8_t>(RejectReason::kUninitialized)};
  const std::string why = "test daemon: chunk 1 is not there";
  reject.insert(reject.end(), why.begin(), why.end());
  answer(c1.header, ControlOp::kReject, 0, DType::kU8, reject);
  StatusOr<uint64_t> pulled = pulling.get();
  EXPECT_EQ(pulled.status().code(), StatusCode::kFailedPrecondition) << pulled.status();

  std::vector<float> delta(8, 1.0f), fresh(8, -7.0f);
  const ModelUpdate u{7, f32(delta), f32(fresh)};
  // Before the fix this sent both chunks and then waited for answers that never come.
  auto applied = client_->applyAndPull({&u, 1}, Deadline::afterMs(3000));
  EXPECT_EQ(applied.status().code(), StatusCode::kFailedPrecondition) << applied.status();
  EXPECT_NE(applied.status().message().find("chunk 1"), std::string::npos) << applied.status();
  EXPECT_EQ(fresh, std::vector<float>(8, -7.0f));
  client_->leave();
  Message next = nextControl();
  ASSERT_TRUE(next.status.ok()) << next.status;
  EXPECT_EQ(next.header.opcode, static_cast<uint8_t>(ControlOp::kModelLeave))
      << "the refused apply-pull sent " << next.header.describe();
}

// An apply-pull answer is 24 bytes plus a chunk and must fit in a message (1 GiB): the old
// maximum of COFAB_PS_MODEL_CHUNK_BYTES (1 GiB) is refused before connecting, naming the
// parameter (before the fix it was accepted and the connect went ahead); 1 GiB - 24 is accepted
// (the call gets as far as connecting, to nobody). ClientOptions::chunkBytes is held to the same.
TEST(ModelClientChunkBytes, TheOldMaximumIsRefusedNamingTheParameter) {
  ClientOptions o;
  o.serverAddresses = {"127.0.0.1:1"};
  o.connectTimeoutMs = 300;
  {
    ScopedParamOverride big("COFAB_PS_MODEL_CHUNK_BYTES", std::to_string(1 << 30));
    auto c = ModelClient::connect(0, 1, o);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(c.status().message().find("COFAB_PS_MODEL_CHUNK_BYTES"), std::string::npos)
        << c.status();
  }
  {
    ScopedParamOverride atMax("COFAB_PS_MODEL_CHUNK_BYTES", std::to_string((1 << 30) - 24));
    auto c = ModelClient::connect(0, 1, o);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().message().find("COFAB_PS_MODEL_CHUNK_BYTES"), std::string::npos)
        << c.status();
    EXPECT_NE(c.status().message().find("aggregator 0"), std::string::npos) << c.status();
  }
  ClientOptions explicitBig = o;
  explicitBig.chunkBytes = size_t{1} << 30;
  auto c = ModelClient::connect(0, 1, explicitBig);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("chunkBytes"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace cofab::ps
