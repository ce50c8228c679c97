#include "aggregator/compressed_reduce.h"

#include "aggregator/reducer.h"
#include "core/check.h"
#include "fabric/ps/ps_protocol.h"

namespace cofab::aggregator {

StatusOr<compress::Compression> compressionOfPush(uint8_t opcode) {
  const uint8_t bits = opcode & ps::kPushCompressionBits;
  if ((opcode & ps::kPushReplyFeedback) != 0 && bits != ps::kPushOneBit) {
    return InvalidArgument("push asks for reply feedback without 1-bit compression");
  }
  if (bits == 0) return compress::Compression::kNone;
  if (bits == ps::kPushInt8) return compress::Compression::kInt8;
  if (bits == ps::kPushOneBit) return compress::Compression::kOneBit;
  return InvalidArgument("push names two codecs (int8 and onebit bits both set)");
}

std::shared_ptr<std::vector<uint8_t>> compressedReduce(
    compress::Compression codec, bool average,
    std::span<const std::shared_ptr<std::vector<uint8_t>>> contributions, size_t count,
    size_t block, float* residual) {
  const size_t n = contributions.size();
  std::vector<float> decoded(n * count);
  std::vector<const uint8_t*> inputs(n);
  for (size_t r = 0; r < n; ++r) {
    float* dst = decoded.data() + r * count;
    const Status st =
        compress::decompress(codec, contributions[r]->data(), contributions[r]->size(), count, dst);
    COFAB_CHECK(st.ok()) << "contribution checked on arrival: " << st;
    inputs[r] = reinterpret_cast<const uint8_t*>(dst);
  }
  std::vector<float> sum(count);
  reduceInRankOrder(DType::kF32, average, inputs, count, reinterpret_cast<uint8_t*>(sum.data()));
  auto out = std::make_shared<std::vector<uint8_t>>(compress::compressedBytes(codec, count, block));
  // A non-finite block of `sum` is sent as a NaN block and leaves a zero residual behind.
  compress::compress(codec, sum.data(), count, block, residual, out->data());
  return out;
}

}  // namespace cofab::aggregator
