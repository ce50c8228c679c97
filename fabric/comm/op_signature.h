// OpSignature: what one collective call is (operation, sequence number, dtype, count, reduce op,
// root, algorithm), as carried in the wire::Header of every message it sends, so that ranks that
// disagree are told so (InvalidArgument naming both sides) instead of mixing up data.
//
// Header mapping: opcode = OpCode, sequence = the communicator's collective sequence number (or
// the per-peer point-to-point number), dtype, key = element count, iteration = reduce op |
// algorithm << 8 | root << 16, chunkIndex / chunkCount = the message's place in the stream the
// sender sends to this receiver during the operation. Plain values; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "fabric/comm/reduce_kernels.h"
#include "fabric/wire/header.h"

namespace cofab::comm {

// Values travel on the wire: append, never renumber.
enum class OpCode : uint8_t {
  kAllreduce = 1,
  kReduceScatter = 2,
  kAllgather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kSendRecv = 6,
};
std::string_view opCodeName(OpCode code);

// Values travel on the wire: append, never renumber.
enum class Algorithm : uint8_t {
  kRing = 1,    // pipelined chunked ring (reduce-scatter and/or allgather phases)
  kDirect = 2,  // every rank exchanges with every other rank in one step (small messages)
  kChain = 3,   // broadcast: pipelined chain from the root
};
std::string_view algorithmName(Algorithm algorithm);

struct OpSignature {
  OpCode code = OpCode::kAllreduce;
  uint64_t sequence = 0;
  DType dtype = DType::kU8;
  uint64_t count = 0;  // elements per rank as the caller passed them (see collectives.h)
  ReduceOp reduceOp = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kDirect;
  uint32_t root = 0;
  // Point-to-point only, not on the wire: the other rank.
  int peer = -1;

  // "allreduce #7 (ring, 1024 x f32, sum)" for error messages.
  std::string describe() const;
  // The header of message `index` of `total` in the stream this rank sends to one peer.
  wire::Header header(uint32_t senderRank, uint32_t index, uint32_t total) const;
};

// Checks a received header against what this rank expects from `peer` (message `index` of
// `total`). InvalidArgument naming both sides when they called different collectives, counts,
// dtypes, ops, roots or algorithms, or are at different sequence numbers.
Status checkHeader(const OpSignature& expected, int selfRank, int peer, uint32_t index,
                   uint32_t total, const wire::Header& got);

}  // namespace cofab::comm
