#include "fabric/ps/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "fabric/ps/daemon_directory.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/rendezvous/hash_store.h"

namespace cofab::ps {
namespace {

TEST(Placement, IsAFixedFunctionOfKeyChunkAndServers) {
  // Part of the wire contract: workers built at different times must agree.
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(primaryServer(7, 0, 4), primaryServer(7, 0, 4));
  for (uint64_t key = 0; key < 100; ++key) {
    for (uint32_t c = 0; c < 10; ++c) {
      const int p = primaryServer(key, c, 3);
      ASSERT_GE(p, 0);
      ASSERT_LT(p, 3);
      EXPECT_EQ(primaryServer(key, c + 1, 3), (p + 1) % 3) << "chunks go round-robin";
    }
  }
}

TEST(Placement, BigTensorsSpreadEvenlyAndSmallOnesInExpectation) {
  const int m = 4;
  std::vector<int> load(m, 0);
  for (uint32_t c = 0; c < 1001; ++c) load[static_cast<size_t>(primaryServer(42, c, m))]++;
  EXPECT_LE(
      *std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), 1);
  std::vector<int> keys(m, 0);
  for (uint64_t key = 0; key < 4000; ++key) keys[static_cast<size_t>(primaryServer(key, 0, m))]++;
  for (int n : keys) EXPECT_NEAR(n, 1000, 150);
}

TEST(Placement, BackupIsTheNextDaemon) {
  EXPECT_EQ(backupServer(0, 3), 1);
  EXPECT_EQ(backupServer(2, 3), 0);
}

TEST(ChunkLayout, WholeElementsAndALastShortChunk) {
  auto l = chunkLayout(1000, 4, 1024);
  EXPECT_EQ(l.elementsPerChunk, 256u);
  EXPECT_EQ(l.chunkCount, 4u);
  EXPECT_EQ(chunkLayout(0, 4, 1024).chunkCount, 0u);
  EXPECT_EQ(chunkLayout(5, 8, 4).elementsPerChunk, 1u) << "at least one element per chunk";
  EXPECT_EQ(chunkLayout(1024, 2, 2048).chunkCount, 1u);
}

TEST(Protocol, PeerIdsAndStoreKeys) {
  EXPECT_EQ(parseWorkerPeerId(workerPeerId(12)), 12);
  EXPECT_EQ(parseAggregatorPeerId(aggregatorPeerId(3)), 3);
  EXPECT_EQ(parseWorkerPeerId("worker "), -1);
  EXPECT_EQ(parseWorkerPeerId("worker 1x"), -1);
  EXPECT_EQ(parseWorkerPeerId("agg 1"), -1);
  EXPECT_EQ(parseWorkerPeerId("worker -1"), -1);
  EXPECT_EQ(serverAddressKey("cofab/agg", 2), "cofab/agg/server/2");
  EXPECT_EQ(serverCountKey("p"), "p/count");
  for (uint8_t r = 1; r <= kMaxRejectReason; ++r) {
    // 11, 12: unassigned (ps_protocol.h); 15: held for another branch, unassigned here.
    if (r == 11 || r == 12 || r == 15) continue;
    EXPECT_NE(rejectReasonName(static_cast<RejectReason>(r)), "unknown");
  }
}

// Every daemon count cofab-aggd accepts (--servers up to kMaxDaemons) is one its clients find:
// discovery refused more than 4096, so a job with --servers 5000 started and registered every
// daemon, and then every worker's connect failed with "not a daemon count".
TEST(Discovery, TakesEveryDaemonCountTheDaemonAccepts) {
  HashStore store;
  const int m = 5000;
  ASSERT_TRUE(store.set(serverCountKey("p"), toBytes(std::to_string(m))).ok());
  for (int i = 0; i < m; ++i) {
    ASSERT_TRUE(
        store.set(serverAddressKey("p", i), toBytes("127.0.0.1:" + std::to_string(i))).ok());
  }
  auto found = discoverDaemons(store, "p", Deadline::afterMs(5000));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->size(), size_t(m));
  EXPECT_EQ((*found)[4999], "127.0.0.1:4999");
  ASSERT_TRUE(store.set(serverCountKey("p"), toBytes(std::to_string(kMaxDaemons + 1))).ok());
  EXPECT_EQ(discoverDaemons(store, "p", Deadline::afterMs(100)).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cofab::ps
