// ShuffleEndpoint (the coded shuffle's link to an aggregator daemon) against a hand-driven fake
// daemon on a real tcp socket: what it does when the daemon's answers are duplicated, stale or
// missing, and when the daemon stops reading.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "fabric/coded/shuffle_relay.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/transport/registry.h"

namespace cofab::coded {
namespace {

using transport::Connection;

// A listener and the endpoint's connection to it.
struct FakeDaemon {
  std::shared_ptr<transport::Context> ctx;
  std::unique_ptr<transport::Listener> listener;
  std::shared_ptr<Connection> conn;
  std::unique_ptr<ShuffleEndpoint> endpoint;

  Status start() {
    COFAB_ASSIGN_OR_RETURN(ctx, transport::Registry::create("tcp", {}));
    COFAB_ASSIGN_OR_RETURN(listener, ctx->listen({}));
    auto connecting = std::async(std::launch::async, [this] {
      return ShuffleEndpoint::connect(listener->address(), 0, Deadline::afterMs(10000));
    });
    COFAB_ASSIGN_OR_RETURN(conn, listener->accept(Deadline::afterMs(10000)));
    COFAB_ASSIGN_OR_RETURN(endpoint, connecting.get());
    return OkStatus();
  }
  ~FakeDaemon() {
    endpoint.reset();
    if (ctx) {
      ctx->close();
      ctx->join();
    }
  }
  // One message from the endpoint, and its payload.
  // The payload travels in the promise and is copied out only once it arrived: a callback that
  // fires after a timeout here must not write into the caller's (gone) vector.
  StatusOr<wire::Header> recv(std::vector<uint8_t>* payload = nullptr) {
    using Got = std::pair<StatusOr<wire::Header>, std::vector<uint8_t>>;
    auto got = std::make_shared<std::promise<Got>>();
    auto f = got->get_future();
    conn->recvOwned([got](const Status& s, const wire::Header& h, std::vector<uint8_t>&& p) {
      got->set_value(
          Got(s.ok() ? StatusOr<wire::Header>(h) : StatusOr<wire::Header>(s), std::move(p)));
    });
    if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return DeadlineExceeded("nothing from the endpoint");
    }
    Got g = f.get();
    if (payload != nullptr) *payload = std::move(g.second);
    return g.first;
  }
  void control(ps::ControlOp op, const wire::Header& about) {
    conn->send(ps::controlHeader(op, about), nullptr, 0, [](const Status&) {});
  }
  void reply(const wire::Header& about, const std::vector<uint8_t>& payload) {
    wire::Header h = about;
    h.type = wire::MessageType::kPullReply;
    auto body = std::make_shared<std::vector<uint8_t>>(payload);
    conn->send(h, body->data(), body->size(), [body](const Status&) {});
  }
};

// The daemon answers one of two pulled keys twice and the other never: the pull must not
// count the duplicate as the missing row (its row would stay unwritten, silently).
TEST(ShuffleEndpoint, ADuplicatedReplyDoesNotStandInForAMissingRow) {
  FakeDaemon d;
  ASSERT_TRUE(d.start().ok());
  const std::vector<int64_t> offsets = {0, 1};
  std::vector<uint8_t> out(8, 0);
  auto pulling = std::async(std::launch::async, [&] {
    return d.endpoint->pull(7, 100, offsets, 4, /*planTag=*/0, out, Deadline::afterMs(1000));
  });
  auto first = d.recv(), second = d.recv();
  ASSERT_TRUE(first.ok() && second.ok());
  const wire::Header& k0 = first->key == 100 ? *first : *second;
  const std::vector<uint8_t> rowAndTag = {1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0};  // tag 0
  d.reply(k0, rowAndTag);
  d.reply(k0, rowAndTag);  // duplicated; key 101 is never answered
  const Status s = pulling.get();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  // The deadline names what never came, not only that the daemon was silent. (Key 100 too, if
  // a loaded machine delivered its reply after the deadline.)
  EXPECT_NE(s.message().find("no row for"), std::string::npos) << s;
  EXPECT_NE(s.message().find("101)"), std::string::npos) << s;
}

// The daemon acks one of two uploaded rows: the upload's deadline names the unacked key.
TEST(ShuffleEndpoint, AnUploadDeadlineNamesTheRowsNotAcked) {
  FakeDaemon d;
  ASSERT_TRUE(d.start().ok());
  const std::vector<uint8_t> rows(8, 1);
  auto uploading = std::async(std::launch::async, [&] {
    return d.endpoint->upload(3, 500, rows, 4, /*planTag=*/0, Deadline::afterMs(1000));
  });
  auto first = d.recv(), second = d.recv();
  ASSERT_TRUE(first.ok() && second.ok());
  wire::Header ack = first->key == 500 ? *first : *second;
  ack.type = wire::MessageType::kControl;
  ack.opcode = static_cast<uint8_t>(ps::ControlOp::kAck);
  d.conn->send(ack, nullptr, 0, [](const Status&) {});
  const auto r = uploading.get();
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  // (Key 500 too, if a loaded machine delivered its ack after the deadline.)
  EXPECT_NE(r.status().message().find("no ack for"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("501)"), std::string::npos) << r.status();
}

// The daemon stops reading while an upload is under way: the upload fails at its deadline, and
// returns only once no send reads the caller's rows any more: what the caller writes there
// afterwards never reaches the daemon.
TEST(ShuffleEndpoint, AFailedUploadReturnsOnlyOnceItsSendsAreDone) {
  FakeDaemon d;
  ASSERT_TRUE(d.start().ok());
  // 64 MiB of rows: far more than the socket buffers take while the daemon does not read.
  std::vector<uint8_t> rows(64u << 20, 0x5a);
  auto r = d.endpoint->upload(1, 0, rows, 1 << 20, /*planTag=*/0, Deadline::afterMs(300));
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  std::fill(rows.begin(), rows.end(), 0xa5);  // the caller has its memory back
  // The daemon reads again, until the connection ends (the endpoint closed it to cancel what
  // was still queued): every row it gets is the one uploaded.
  int got = 0;
  for (;;) {
    std::vector<uint8_t> payload;
    auto m = d.recv(&payload);
    if (!m.ok()) break;
    ++got;
    ASSERT_EQ(payload.size(), (1u << 20) + coded::kShufflePlanTagBytes);  // the row, its tag
    EXPECT_EQ(std::count(payload.begin(), payload.end() - coded::kShufflePlanTagBytes, 0x5a),
              static_cast<std::ptrdiff_t>(1u << 20))
        << "row " << m->key << " was read after upload() returned";
  }
  EXPECT_GT(got, 0);
}

// The plain (uncoded) path reads rows straight out of the caller's buffers: wrong sizes and
// mismatched row lengths are refused as the coded path's encode()/decode() refuse them, never
// read past a buffer or divided by (rowBytes 0 crashed the upload with SIGFPE).
TEST(ShuffleMessages, ThePlainPathChecksItsBuffersLikeTheCodedOne) {
  constexpr int64_t kRows = 48;
  constexpr size_t kRowBytes = 8;
  auto shuffle = coding::CodedShuffle::create({.workers = 4, .cacheFraction = 0.5, .rows = kRows});
  ASSERT_TRUE(shuffle.ok()) << shuffle.status();
  auto plan = shuffle->planEpoch(1, kRowBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint8_t> data(kRows * kRowBytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);

  for (const bool coded : {false, true}) {
    SCOPED_TRACE(coded ? "coded" : "plain");
    EXPECT_EQ(shuffleEpochMessages(*shuffle, *plan, coded, std::span(data).first(40), kRowBytes)
                  .status()
                  .code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(shuffleEpochMessages(*shuffle, *plan, coded, data, 0).status().code(),
              StatusCode::kInvalidArgument);
  }

  // Worker 0's batch from its cache: right sizes work and give the data set's rows.
  auto cache = shuffle->buildCache(0, data, kRowBytes);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto messages = shuffleEpochMessages(*shuffle, *plan, false, data, kRowBytes);
  ASSERT_TRUE(messages.ok()) << messages.status();
  const std::vector<int64_t> offsets = shuffleOffsetsFor(*plan, 0, false);
  std::vector<uint8_t> received;
  for (int64_t o : offsets) {
    received.insert(received.end(), messages->begin() + o * kRowBytes,
                    messages->begin() + (o + 1) * kRowBytes);
  }
  std::vector<uint8_t> batch(plan->batch[0].size() * kRowBytes);
  ASSERT_TRUE(
      shuffleBuildBatch(*shuffle, *plan, false, *cache, kRowBytes, offsets, received, batch).ok());
  for (size_t i = 0; i < plan->batch[0].size(); ++i) {
    EXPECT_EQ(std::memcmp(batch.data() + i * kRowBytes, data.data() + plan->batch[0][i] * kRowBytes,
                          kRowBytes),
              0)
        << "row " << i;
  }
  ASSERT_FALSE(offsets.empty()) << "worker 0 needs rows from the master in this plan";

  // Rows of another length than the cache's, and too few received rows: refused.
  std::vector<uint8_t> wide(received.size() * 2), wideBatch(batch.size() * 2);
  EXPECT_EQ(
      shuffleBuildBatch(*shuffle, *plan, false, *cache, 2 * kRowBytes, offsets, wide, wideBatch)
          .code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(shuffleBuildBatch(*shuffle, *plan, false, *cache, kRowBytes, {}, {}, batch).code(),
            StatusCode::kInvalidArgument);
  // A coded offset outside the epoch's messages: refused, not written out of bounds.
  const std::vector<int64_t> bad = {static_cast<int64_t>(plan->messages.size())};
  std::vector<uint8_t> one(kRowBytes);
  EXPECT_EQ(shuffleBuildBatch(*shuffle, *plan, true, *cache, kRowBytes, bad, one, batch).code(),
            StatusCode::kInvalidArgument);
}

// A fake daemon and its endpoint, a 4-worker shuffle of 48 rows of 8 bytes, and worker 0's
// cache: what the plan-checking tests below call the shuffle functions with.
struct ShuffleRig {
  static constexpr int64_t kRows = 48;
  static constexpr size_t kRowBytes = 8;
  FakeDaemon d;
  StatusOr<coding::CodedShuffle> shuffle =
      coding::CodedShuffle::create({.workers = 4, .cacheFraction = 0.5, .rows = kRows});
  const std::vector<uint8_t> data = std::vector<uint8_t>(kRows * kRowBytes, 5);
  StatusOr<coding::WorkerCache> cache =
      shuffle.ok() ? shuffle->buildCache(0, data, kRowBytes) : shuffle.status();

  Status start() {
    COFAB_RETURN_IF_ERROR(shuffle.status());
    COFAB_RETURN_IF_ERROR(cache.status());
    return d.start();
  }
  StatusOr<coding::ShufflePlan> plan(int64_t epoch) const {
    return shuffle->planEpoch(epoch, kRowBytes);
  }
  // The master's and worker 0's calls for `p`, each with a short deadline.
  Status upload(const coding::ShufflePlan& p, bool coded) {
    return shuffleUploadEpoch(*d.endpoint, *shuffle, p, coded, data, kRowBytes,
                              Deadline::afterMs(300))
        .status();
  }
  Status release(const coding::ShufflePlan& p, bool coded) {
    return shuffleReleaseEpoch(*d.endpoint, p, coded, Deadline::afterMs(300));
  }
  Status receive(const coding::ShufflePlan& p, bool coded) {
    std::vector<uint8_t> batch(p.batch.empty() ? 0 : p.batch[0].size() * kRowBytes);
    return shuffleReceiveEpoch(*d.endpoint, *shuffle, p, coded, *cache, kRowBytes, batch,
                               Deadline::afterMs(300));
  }
};

// An epoch's keys (relay) and tags (broadcast) give it 30 bits: past them two epochs share keys,
// and a daemon still holding the older one takes the newer upload for a resend (acks it, keeps
// the old rows), so workers would decode the wrong rows and report success. Refused instead.
TEST(ShuffleMessages, EpochsOutsideTheAddressableRangeAreRefused) {
  ShuffleRig r;
  ASSERT_TRUE(r.start().ok());
  for (const int64_t epoch : {kShuffleEpochLimit, int64_t{-1}, INT64_MAX}) {
    SCOPED_TRACE(epoch);
    auto plan = r.plan(epoch);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const bool coded : {false, true}) {
      const Status up = r.upload(*plan, coded);
      EXPECT_EQ(up.code(), StatusCode::kInvalidArgument) << up;
      EXPECT_NE(up.message().find("epoch"), std::string::npos) << up;
      EXPECT_EQ(r.release(*plan, coded).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(r.receive(*plan, coded).code(), StatusCode::kInvalidArgument);
    }
  }
}

// ShufflePlan is a plain struct: one whose source and batch lists differ in shape is refused
// before anything indexes one by the other (shuffleOffsetsFor read past source's end).
TEST(ShuffleMessages, APlanWithMismatchedListsIsRefusedBeforeItIsRead) {
  ShuffleRig r;
  ASSERT_TRUE(r.start().ok());
  for (int variant = 0; variant < 2; ++variant) {
    auto plan = r.plan(1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (variant == 0) {
      plan->source.clear();
    } else {
      plan->source[0].pop_back();
    }
    EXPECT_TRUE(shuffleOffsetsFor(*plan, 0, false).empty());
    EXPECT_EQ(r.receive(*plan, false).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.release(*plan, false).code(), StatusCode::kInvalidArgument);
  }
}

// A late ack for an earlier upload of message 0 carries the release's key too: release() used to
// take it as its own answer and return OK before the daemon had freed anything. Only the reply
// that echoes the release request's sequence counts.
TEST(ShuffleEndpoint, AStaleUploadAckIsNotTheReleasesAnswer) {
  FakeDaemon d;
  ASSERT_TRUE(d.start().ok());
  wire::Header staleAbout;
  staleAbout.key = 100;  // message 0 of an upload at keyBase 100: sequence 0
  staleAbout.chunkCount = 1;
  d.control(ps::ControlOp::kAck, staleAbout);
  auto releasing = std::async(std::launch::async,
                              [&] { return d.endpoint->release(100, 3, Deadline::afterMs(300)); });
  auto request = d.recv();
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->opcode, static_cast<uint8_t>(ps::ControlOp::kFanOutRelease));
  const Status unanswered = releasing.get();
  EXPECT_EQ(unanswered.code(), StatusCode::kDeadlineExceeded) << unanswered;
  EXPECT_NE(unanswered.message().find("release"), std::string::npos) << unanswered;
  // Answered for real (the ack echoes the request), the next release completes.
  auto again = std::async(std::launch::async,
                          [&] { return d.endpoint->release(100, 3, Deadline::afterMs(10000)); });
  auto second = d.recv();
  ASSERT_TRUE(second.ok()) << second.status();
  d.control(ps::ControlOp::kAck, *second);
  EXPECT_TRUE(again.get().ok());
}

// The mirror case: a release's late ack (an earlier release of these keys timed out) carries
// the key of an upload's first message, and in epoch 0 its iteration too. The upload counted it
// as that message's ack and could return before the daemon had answered the push (a reject of
// it never read). Only acks of pushes count: this upload's key 600 is never acked.
TEST(ShuffleEndpoint, ALateReleaseAckIsNotAnUploadsAck) {
  FakeDaemon d;
  ASSERT_TRUE(d.start().ok());
  wire::Header lateRelease;
  lateRelease.key = 600;
  lateRelease.chunkCount = 1;
  lateRelease.sequence = (uint64_t{1} << 63) | 1;  // a release's, as releaseOnce numbers them
  d.control(ps::ControlOp::kAck, lateRelease);
  const std::vector<uint8_t> rows(8, 1);
  auto uploading = std::async(std::launch::async, [&] {
    return d.endpoint->upload(0, 600, rows, 4, /*planTag=*/0, Deadline::afterMs(1000));
  });
  auto first = d.recv(), second = d.recv();
  ASSERT_TRUE(first.ok() && second.ok());
  wire::Header ack = first->key == 601 ? *first : *second;
  ASSERT_EQ(ack.key, 601u);
  ack.type = wire::MessageType::kControl;
  ack.opcode = static_cast<uint8_t>(ps::ControlOp::kAck);
  d.conn->send(ack, nullptr, 0, [](const Status&) {});
  const auto r = uploading.get();
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find("600"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace cofab::coded
