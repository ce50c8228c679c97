#include "fabric/sync/gossip_peers.h"

#include <gtest/gtest.h>

#include <set>

namespace cofab::sync {
namespace {

// Every round is a matching (the peer of my peer is me), at most one rank sits out (odd counts
// only), and the pairing is the same whichever rank computes it (it depends on nothing else).
TEST(GossipPeersTest, EveryRoundIsAPerfectMatching) {
  for (bool random : {false, true}) {
    for (int w = 1; w <= 7; ++w) {
      for (uint64_t round = 0; round < 20; ++round) {
        int idle = 0;
        for (int r = 0; r < w; ++r) {
          int p = gossipPeer(r, w, round, random, 5);
          if (p < 0) {
            ++idle;
            continue;
          }
          ASSERT_NE(p, r);
          ASSERT_LT(p, w);
          EXPECT_EQ(gossipPeer(p, w, round, random, 5), r) << "w " << w << " round " << round;
        }
        EXPECT_EQ(idle, w == 1 ? 1 : w % 2)
            << "w " << w << " round " << round << " random " << random;
      }
    }
  }
}

// Ring: each worker alternates between its right and its left neighbour, so information goes
// around the ring in both directions.
TEST(GossipPeersTest, RingAlternatesNeighbours) {
  const int w = 4;
  for (int r = 0; r < w; ++r) {
    std::set<int> peers{gossipPeer(r, w, 0, false, 0), gossipPeer(r, w, 1, false, 0)};
    EXPECT_EQ(peers, (std::set<int>{(r + 1) % w, (r + w - 1) % w})) << "rank " << r;
  }
}

// Random: the pairing changes across rounds (ring would use only two).
TEST(GossipPeersTest, RandomPairingsVary) {
  std::set<int> peersOfZero;
  for (uint64_t round = 0; round < 50; ++round)
    peersOfZero.insert(gossipPeer(0, 6, round, true, 1));
  EXPECT_GT(peersOfZero.size(), 2u);
}

}  // namespace
}  // namespace cofab::sync
