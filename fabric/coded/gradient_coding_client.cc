#include "fabric/coded/gradient_coding_client.h"

#include <memory>
#include <string>

namespace cofab::coded {

StatusOr<GradientCodingClient> GradientCodingClient::create(ps::PushPullClient* client,
                                                            int stragglers) {
  if (client == nullptr) return InvalidArgument("GradientCodingClient: client is null");
  COFAB_ASSIGN_OR_RETURN(coding::FractionalRepetitionCode code,
                         coding::FractionalRepetitionCode::create(
                             {.workers = client->worldSize(), .stragglers = stragglers}));
  return GradientCodingClient(client, std::move(code));
}

StatusOr<ps::PushPullHandle> GradientCodingClient::pushPull(
    uint64_t key, std::span<const std::span<const float>> gradients, std::span<float> out,
    ps::PushPullOptions options) {
  if (options.op != ps::ReduceOp::kSum) {
    return InvalidArgument("gradient coding: rounds are sums (the daemons reject averages)");
  }
  std::vector<float>& enc = encoded_[key];
  enc.assign(out.size(), 0.0f);
  COFAB_RETURN_IF_ERROR(code_.encode(client_->rank(), gradients, enc));
  return client_->pushPull(key, TensorView(enc.data(), enc.size(), DType::kF32),
                           TensorView(out.data(), out.size(), DType::kF32), options);
}

}  // namespace cofab::coded
