// Compressed push-pull on the daemon (docs/COMPRESSION.md): a compressed contribution is
// checked against its codec's exact size, every contribution of a round is decompressed into
// f32, folded in rank order by the reducer (so results stay deterministic), optionally averaged,
// and the result is recompressed for the way back — statelessly, or for 1-bit pushes with
// ps::kPushReplyFeedback with the slot's own residual (error feedback on the reply, kept by the
// engine per (key, chunk)). Pure functions; called on the slot's engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "fabric/compress/codec.h"

namespace cofab::aggregator {

// The codec named by a push's opcode bits (kNone without compression bits); InvalidArgument
// when both bits are set, or the reply-feedback bit comes without the 1-bit one.
StatusOr<compress::Compression> compressionOfPush(uint8_t opcode);

// Decompress each contribution (already checked with compress::inspect: `count` elements in
// blocks of `block`), sum (or average) in rank order in f32, recompress into a new buffer.
// `residual`: `count` floats of error feedback, or null. A block whose f32 result is not finite
// (a contribution carried an Inf or a NaN, or finite ones summed past FLT_MAX) goes back as a
// NaN block, as the f32 sum would, and
// its residual is reset to 0 rather than poisoning the slot's later rounds (compress::compress).
std::shared_ptr<std::vector<uint8_t>> compressedReduce(
    compress::Compression codec, bool average,
    std::span<const std::shared_ptr<std::vector<uint8_t>>> contributions, size_t count,
    size_t block, float* residual);

}  // namespace cofab::aggregator
