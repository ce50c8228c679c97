// PushPullClient failures that need no daemon: bad arguments, nobody registered, nobody
// listening. Each must be a Status that says what to do, never a hang.
#include <gtest/gtest.h>

#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/hash_store.h"

namespace cofab::ps {
namespace {

TEST(PushPullClient, RankOutsideTheWorldIsInvalid) {
  HashStore store;
  auto c = PushPullClient::connect(store, 3, 2, {});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
}

TEST(PushPullClient, NoDaemonRegisteredTimesOutNamingTheFix) {
  HashStore store;
  ClientOptions o;
  o.connectTimeoutMs = 100;
  auto c = PushPullClient::connect(store, 0, 1, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("cofab-aggd"), std::string::npos) << c.status();
}

TEST(PushPullClient, StaticAddressWithNobodyListeningFails) {
  ClientOptions o;
  o.serverAddresses = {"127.0.0.1:1"};
  o.connectTimeoutMs = 300;
  auto c = PushPullClient::connect(0, 1, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("aggregator 0"), std::string::npos) << c.status();
}

// With replication, a failover deadline within two heartbeat periods would fail a live, busy
// primary over before its answer to the ping could arrive (or before a ping went out at all):
// refused at connect, naming both settings.
TEST(PushPullClient, AFailoverDeadlineWithinTwoHeartbeatsIsRefusedWithReplication) {
  ClientOptions o;
  o.serverAddresses = {"127.0.0.1:1"};
  o.connectTimeoutMs = 300;
  o.replication = 1;
  o.heartbeatMs = 500;
  o.failoverMs = 200;
  auto c = PushPullClient::connect(0, 1, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("COFAB_PS_FAILOVER_MS"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("COFAB_PS_HEARTBEAT_MS"), std::string::npos) << c.status();
}

TEST(PushPullClient, WithoutAStoreTheAddressesAreRequired) {
  auto c = PushPullClient::connect(0, 1, ClientOptions{});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("serverAddresses"), std::string::npos) << c.status();
}

// A chunk larger than a message may carry is the caller's configuration error, said at
// connect. It used to pass, and the first large pushPull failed to send and was reported as a
// lost daemon.
TEST(PushPullClient, AChunkSizeOverTheMessageLimitIsRefusedAtConnect) {
  ClientOptions o;
  o.serverAddresses = {"127.0.0.1:1"};
  o.connectTimeoutMs = 300;
  o.chunkBytes = (size_t{1} << 30) + 64;
  auto c = PushPullClient::connect(0, 1, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("chunkBytes"), std::string::npos) << c.status();
}

TEST(PushPullClient, InvalidHandleSaysSo) {
  PushPullHandle h;
  EXPECT_FALSE(h.valid());
  EXPECT_EQ(h.wait(Deadline::afterMs(1)).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cofab::ps
