// How the broadcast shuffle (shuffle_broadcast.h) cuts a row into frames, and the check a
// receiver makes before it trusts a frame's piece. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cofab::coded {

// A row of `rowBytes` is sent as count = ceil(rowBytes / segmentBytes) pieces: piece i holds
// bytes [i * segmentBytes, min((i + 1) * segmentBytes, rowBytes)).
uint32_t shuffleSegmentCount(size_t rowBytes, size_t segmentBytes);

// The segment size S for which a data frame's claim (piece `index` of `count`, at byte `offset`,
// `length` bytes) is a piece of that cut of a row of `rowBytes`, or 0 when it is a piece of no
// cut. Pieces of one row accepted only while they agree on S tile the row exactly: counting W
// distinct indices then means every byte arrived (without the check a frame with a wrong
// offset completed a row and left a hole of stale bytes). For a single piece S is rowBytes.
size_t shuffleSegmentSize(size_t rowBytes, uint32_t count, uint32_t index, size_t offset,
                          size_t length);

}  // namespace cofab::coded
