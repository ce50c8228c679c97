#include "fabric/comm/op_signature.h"

namespace cofab::comm {
namespace {

uint64_t packIteration(const OpSignature& s) {
  return static_cast<uint64_t>(s.reduceOp) | (static_cast<uint64_t>(s.algorithm) << 8) |
         (static_cast<uint64_t>(s.root) << 16);
}

// What the sender's header says it was doing, in the same words as OpSignature::describe().
std::string describeHeader(const wire::Header& h) {
  const auto code = static_cast<OpCode>(h.opcode);
  const auto op = static_cast<ReduceOp>(h.iteration & 0xff);
  const auto algo = static_cast<Algorithm>((h.iteration >> 8) & 0xff);
  std::string s = std::string(opCodeName(code)) + " #" + std::to_string(h.sequence) + " (" +
                  std::string(algorithmName(algo)) + ", " + std::to_string(h.key) + " x " +
                  (isValidDType(static_cast<uint8_t>(h.dtype)) ? std::string(dtypeName(h.dtype))
                                                               : std::string("?"));
  if (code == OpCode::kAllreduce || code == OpCode::kReduceScatter) {
    s += ", " + std::string(reduceOpName(op));
  }
  if (code == OpCode::kBroadcast) s += ", root " + std::to_string(h.iteration >> 16);
  return s + ")";
}

}  // namespace

std::string_view opCodeName(OpCode code) {
  switch (code) {
    case OpCode::kAllreduce: return "allreduce";
    case OpCode::kReduceScatter: return "reduce_scatter";
    case OpCode::kAllgather: return "allgather";
    case OpCode::kBroadcast: return "broadcast";
    case OpCode::kBarrier: return "barrier";
    case OpCode::kSendRecv: return "send/recv";
  }
  return "unknown-op";
}

std::string_view algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kChain: return "chain";
  }
  return "unknown-algorithm";
}

std::string OpSignature::describe() const {
  wire::Header h = header(0, 0, 0);
  return describeHeader(h);
}

wire::Header OpSignature::header(uint32_t senderRank, uint32_t index, uint32_t total) const {
  wire::Header h;
  h.type = wire::MessageType::kData;
  h.senderRank = senderRank;
  h.chunkIndex = index;
  h.chunkCount = total;
  h.dtype = dtype;
  h.opcode = static_cast<uint8_t>(code);
  h.key = count;
  h.sequence = sequence;
  h.iteration = packIteration(*this);
  if (index + 1 == total) h.flags = wire::kFlagLastChunk;
  return h;
}

Status checkHeader(const OpSignature& expected, int selfRank, int peer, uint32_t index,
                   uint32_t total, const wire::Header& got) {
  const bool sameOp = got.opcode == static_cast<uint8_t>(expected.code) &&
                      got.dtype == expected.dtype && got.key == expected.count &&
                      got.iteration == packIteration(expected);
  if (sameOp && got.sequence == expected.sequence && got.chunkIndex == index &&
      got.chunkCount == total && got.senderRank == static_cast<uint32_t>(peer)) {
    return OkStatus();
  }
  const std::string who = "rank " + std::to_string(peer) + " called " + describeHeader(got) +
                          " while rank " + std::to_string(selfRank) + " called " +
                          expected.describe();
  if (!sameOp || got.sequence != expected.sequence) {
    if (sameOp) {
      return InvalidArgument(
          "collective sequence mismatch: " + who +
          " (a rank skipped, repeated or reordered a collective on this communicator)");
    }
    return InvalidArgument("collective mismatch: " + who +
                           " (every rank must call the same collectives in the same order, "
                           "with the same count, dtype, op and root)");
  }
  if (got.senderRank != static_cast<uint32_t>(peer)) {
    return InvalidArgument("message from rank " + std::to_string(got.senderRank) +
                           " arrived on the connection to rank " + std::to_string(peer) +
                           " during " + expected.describe());
  }
  return InvalidArgument("chunking mismatch in " + expected.describe() + ": rank " +
                         std::to_string(peer) + " sent message " + std::to_string(got.chunkIndex) +
                         "/" + std::to_string(got.chunkCount) + " where rank " +
                         std::to_string(selfRank) + " expected " + std::to_string(index) + "/" +
                         std::to_string(total) +
                         " (do the ranks use different COFAB_RING_CHUNK_BYTES?)");
}

}  // namespace cofab::comm
