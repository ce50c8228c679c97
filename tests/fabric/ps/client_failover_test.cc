// PushPullClient failover with replication on, against hand-driven daemons on real tcp sockets:
// what the client does when a second daemon dies. One failure per replica pair (daemon p and
// its backup p + 1) is tolerated; both daemons of a pair gone leaves some chunks with no copy
// anywhere, and the client must then fail (Unavailable, naming both) instead of sending those
// chunks to a daemon that never saw them or leaving an operation that can never complete.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fabric/ps/placement.h"
#include "fabric/ps/push_pull.h"
#include "fabric/transport/registry.h"
#include "tests/fabric/ps/raw_messages.h"

namespace cofab::ps {
namespace {

using cofab::ps::testing::Message;
using cofab::ps::testing::recvOne;

// A key whose chunk 0 has daemon `primary` as its primary among `m`.
uint64_t keyWithPrimary(int primary, int m) {
  for (uint64_t key = 1;; ++key) {
    if (primaryServer(key, 0, m) == primary) return key;
  }
}

bool waitForFailovers(const PushPullClient& client, uint64_t n) {
  const Deadline d = Deadline::afterMs(10000);
  while (client.stats().failovers < n && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return client.stats().failovers >= n;
}

TEST(PushPullClientFailover, BothDaemonsOfAReplicaPairGoneFailTheClientNamingThem) {
  auto ctx = transport::Registry::create("tcp", {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  constexpr int kDaemons = 3;
  std::vector<std::unique_ptr<transport::Listener>> listeners;
  ClientOptions o;
  for (int i = 0; i < kDaemons; ++i) {
    auto l = (*ctx)->listen({});
    ASSERT_TRUE(l.ok()) << l.status();
    o.serverAddresses.push_back((*l)->address());
    listeners.push_back(std::move(l).value());
  }
  o.replication = 1;
  o.connectTimeoutMs = 10000;
  auto connecting =
      std::async(std::launch::async, [&] { return PushPullClient::connect(0, 1, o); });
  std::vector<std::shared_ptr<transport::Connection>> daemons;
  for (auto& l : listeners) {
    auto a = l->accept(Deadline::afterMs(10000));
    ASSERT_TRUE(a.ok()) << a.status();
    daemons.push_back(std::move(a).value());
  }
  auto client = connecting.get();
  ASSERT_TRUE(client.ok()) << client.status();

  // Daemon 0 dies: its chunks go to daemon 1, its backup.
  daemons[0]->close();
  ASSERT_TRUE(waitForFailovers(**client, 1));
  const uint64_t key = keyWithPrimary(0, kDaemons);
  std::vector<float> in(256, 1.0f), out(256, 0.0f);
  PushPullHandle h = (*client)->pushPull(key, TensorView(in.data(), in.size(), DType::kF32),
                                         TensorView(out.data(), out.size(), DType::kF32),
                                         {.delivery = Delivery::kPull});
  Message m = recvOne(*daemons[1], 10000);
  ASSERT_TRUE(m.status.ok()) << m.status;
  ASSERT_EQ(m.header.type, wire::MessageType::kPush);
  ASSERT_EQ(m.header.key, key);

  // Daemon 1 dies before answering: the chunk's primary and backup are both gone. It must not
  // go on to daemon 2, which holds none of its round; the op and the client fail.
  daemons[1]->close();
  const Status s = h.wait(Deadline::afterMs(10000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("aggregator 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("aggregator 1"), std::string::npos) << s;
  EXPECT_EQ((*client)->status().code(), StatusCode::kUnavailable) << (*client)->status();

  // A later op whose chunk lives on that pair fails at once too (it used to hang: refused
  // before its first chunk was pending, it was never finished).
  std::vector<float> in2(256, 2.0f), out2(256, 0.0f);
  PushPullHandle later = (*client)->pushPull(key, TensorView(in2.data(), in2.size(), DType::kF32),
                                             TensorView(out2.data(), out2.size(), DType::kF32),
                                             {.delivery = Delivery::kPull});
  EXPECT_EQ(later.wait(Deadline::afterMs(10000)).code(), StatusCode::kUnavailable);

  // Nothing of that key reached daemon 2.
  for (;;) {
    Message seen = recvOne(*daemons[2], 300);
    if (!seen.status.ok()) break;
    EXPECT_FALSE(seen.header.type == wire::MessageType::kPush && seen.header.key == key)
        << "a chunk went to daemon 2, which is neither its primary nor its backup";
  }
  (*client)->close();
  (*ctx)->close();
  (*ctx)->join();
}

}  // namespace
}  // namespace cofab::ps
