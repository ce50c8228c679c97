// ModelClient failures that need no daemon: bad arguments, nobody registered, nobody listening.
// Each must be a Status that says what to do, never a hang.
#include <gtest/gtest.h>

#include "fabric/ps/model_client.h"
#include "fabric/rendezvous/hash_store.h"

namespace cofab::ps {
namespace {

TEST(ModelClient, RankOutsideTheWorldIsInvalid) {
  HashStore store;
  auto c = ModelClient::connect(store, 3, 2, {});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
}

TEST(ModelClient, NoDaemonRegisteredTimesOutNamingTheFix) {
  HashStore store;
  ClientOptions o;
  o.connectTimeoutMs = 100;
  auto c = ModelClient::connect(store, 0, 1, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("cofab-aggd"), std::string::npos) << c.status();
}

TEST(ModelClient, StaticAddressWithNobodyListeningFails) {
  ClientOptions o;
  o.serverAddresses = {"127.0.0.1:1"};
  o.connectTimeoutMs = 300;
  auto c = ModelClient::connect(0, 1, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("aggregator 0"), std::string::npos) << c.status();
  auto none = ModelClient::connect(0, 1, ClientOptions{});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument)
      << "without a store the addresses are required";
  EXPECT_NE(none.status().message().find("serverAddresses"), std::string::npos) << none.status();
}

}  // namespace
}  // namespace cofab::ps
