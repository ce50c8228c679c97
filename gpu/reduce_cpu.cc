// CPU twins of the reduction and XOR kernels: the same per-element functors, a plain loop.
#include <cstring>
#include <vector>

#include "gpu/ops_validate.h"
#include "gpu/reduce_math.h"
#include "gpu/xor_math.h"

namespace cofab::gpu {
namespace {

template <typename Io>
void reduceTyped(const ReduceArgs& a) {
  using S = typename Io::Storage;
  std::vector<const S*> ins;
  for (const TensorView& t : a.inputs) ins.push_back(static_cast<const S*>(t.data));
  S* out = static_cast<S*>(a.output.data);
  const int count = static_cast<int>(ins.size());
  const float scale = a.op == ReduceOp::kAverage ? 1.0f / static_cast<float>(count) : 1.0f;
  const ReduceElement<Io> element;
  for (size_t i = 0; i < a.output.count; ++i) element(ins.data(), count, out, i, scale);
}

}  // namespace

Status reduceCpu(const ReduceArgs& a) {
  COFAB_RETURN_IF_ERROR(validateReduce(a));
  if (!a.output.device.isCpu()) {
    return InvalidArgument("reduceCpu: tensors are on " + a.output.device.toString());
  }
  switch (a.output.dtype) {
    case DType::kF32:
      reduceTyped<F32Io>(a);
      break;
    case DType::kF16:
      reduceTyped<F16Io>(a);
      break;
    case DType::kBF16:
      reduceTyped<Bf16Io>(a);
      break;
    default:
      return InvalidArgument("reduceCpu: unsupported dtype");  // validateReduce rejects first
  }
  return OkStatus();
}

Status xorBuffersCpu(const XorArgs& a) {
  COFAB_RETURN_IF_ERROR(validateXor(a));
  if (!a.device.isCpu())
    return InvalidArgument("xorBuffersCpu: buffers are on " + a.device.toString());
  const XorWords op;
  auto* dst = static_cast<uint8_t*>(a.dst);
  // Word by word through memcpy, so any alignment works and dst may alias a source.
  size_t i = 0;
  for (; i + 8 <= a.bytes; i += 8) {
    uint64_t acc;
    std::memcpy(&acc, static_cast<const uint8_t*>(a.srcs[0]) + i, 8);
    for (size_t j = 1; j < a.srcs.size(); ++j) {
      uint64_t w;
      std::memcpy(&w, static_cast<const uint8_t*>(a.srcs[j]) + i, 8);
      acc = op(acc, w);
    }
    std::memcpy(dst + i, &acc, 8);
  }
  for (; i < a.bytes; ++i) {
    uint8_t acc = static_cast<const uint8_t*>(a.srcs[0])[i];
    for (size_t j = 1; j < a.srcs.size(); ++j)
      acc = op.byte(acc, static_cast<const uint8_t*>(a.srcs[j])[i]);
    dst[i] = acc;
  }
  return OkStatus();
}

}  // namespace cofab::gpu
