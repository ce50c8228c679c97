// gossipPeer: who a worker averages with in a gossip round (fabric/sync gossip). Every worker
// computes the same pairing independently (no messages): a perfect matching of the ranks, with
// one rank sitting out when the count is odd.
//   ring:   even rounds pair (0,1),(2,3)...; odd rounds (1,2),(3,4)... and (w-1,0) for even w,
//           so each worker alternates between its right and its left neighbour;
//   random: a random pairing drawn from `seed` and the round number.
#pragma once

#include <cstdint>

namespace cofab::sync {

// The peer of `rank` among `world` ranks in `round`, or -1 when it sits the round out.
int gossipPeer(int rank, int world, uint64_t round, bool random, uint64_t seed);

}  // namespace cofab::sync
