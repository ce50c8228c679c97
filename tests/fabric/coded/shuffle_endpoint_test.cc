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
  StatusOr<wire::Header> recv(std::vector<uint8_t>* payload = nullptr) {
    auto got = std::make_shared<std::promise<StatusOr<wire::Header>>>();
    auto f = got->get_future();
    conn->recvOwned(
        [got, payload](const Status& s, const wire::Header& h, std::vector<uint8_t>&& p) {
          if (payload != nullptr) *payload = std::move(p);
          got->set_value(s.ok() ? StatusOr<wire::Header>(h) : StatusOr<wire::Header>(s));
        });
    if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return DeadlineExceeded("nothing from the endpoint");
    }
    return f.get();
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
    return d.endpoint->pull(7, 100, offsets, 4, out, Deadline::afterMs(1000));
  });
  auto first = d.recv(), second = d.recv();
  ASSERT_TRUE(first.ok() && second.ok());
  const wire::Header& k0 = first->key == 100 ? *first : *second;
  d.reply(k0, {1, 2, 3, 4});
  d.reply(k0, {1, 2, 3, 4});  // duplicated; key 101 is never answered
  const Status s = pulling.get();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
}

// The daemon stops reading while an upload is under way: the upload fails at its deadline, and
// returns only once no send reads the caller's rows any more: what the caller writes there
// afterwards never reaches the daemon.
TEST(ShuffleEndpoint, AFailedUploadReturnsOnlyOnceItsSendsAreDone) {
  FakeDaemon d;
  ASSERT_TRUE(d.start().ok());
  // 64 MiB of rows: far more than the socket buffers take while the daemon does not read.
  std::vector<uint8_t> rows(64u << 20, 0x5a);
  auto r = d.endpoint->upload(1, 0, rows, 1 << 20, Deadline::afterMs(300));
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
    EXPECT_EQ(std::count(payload.begin(), payload.end(), 0x5a),
              static_cast<std::ptrdiff_t>(payload.size()))
        << "row " << m->key << " was read after upload() returned";
  }
  EXPECT_GT(got, 0);
}

}  // namespace
}  // namespace cofab::coded
