#include "fabric/coded/gradient_coding_client.h"

#include <memory>
#include <string>
#include <vector>

#include "fabric/ps/placement.h"

namespace cofab::coded {

Status checkDaemonsRunTheCode(ps::PushPullClient& client,
                              const coding::FractionalRepetitionCode& code, uint64_t firstKey,
                              Deadline deadline) {
  const int daemons = client.numServers();
  std::vector<uint64_t> keyOf(daemons);
  std::vector<bool> found(daemons, false);
  for (uint64_t key = firstKey, left = daemons; left > 0; ++key) {
    const int d = ps::primaryServer(key, 0, daemons);
    if (found[d]) continue;
    found[d] = true;
    keyOf[d] = key;
    --left;
  }
  // On this frame: waitEveryHandle() makes sure every operation has ended before returning.
  std::vector<float> one(daemons, 1.0f), got(daemons, 0.0f);
  std::vector<ps::PushPullHandle> probes;
  for (int d = 0; d < daemons; ++d) {
    probes.push_back(client.pushPull(keyOf[d], TensorView(&one[d], 1, DType::kF32),
                                     TensorView(&got[d], 1, DType::kF32)));
  }
  COFAB_RETURN_IF_ERROR(
      ps::waitEveryHandle(client, probes, deadline)
          .withContext("gradient coding: probe of the daemons' configuration (every worker must "
                       "create its client; a round that misses one waits for it)"));
  for (int d = 0; d < daemons; ++d) {
    if (got[d] == static_cast<float>(code.groups())) continue;
    return FailedPrecondition(
        "gradient coding: daemon " + std::to_string(d) + " reduced " + std::to_string(int(got[d])) +
        " contributions of the " + std::to_string(code.workers()) +
        " workers, expected one per group (" + std::to_string(code.groups()) +
        "): start every cofab-aggd with --gradient-stragglers " +
        std::to_string(code.stragglers()));
  }
  return OkStatus();
}

StatusOr<GradientCodingClient> GradientCodingClient::create(ps::PushPullClient* client,
                                                            int stragglers, Deadline deadline) {
  if (client == nullptr) return InvalidArgument("GradientCodingClient: client is null");
  COFAB_ASSIGN_OR_RETURN(coding::FractionalRepetitionCode code,
                         coding::FractionalRepetitionCode::create(
                             {.workers = client->worldSize(), .stragglers = stragglers}));
  COFAB_RETURN_IF_ERROR(checkDaemonsRunTheCode(*client, code, kGradientCodingCheckKeys, deadline));
  return GradientCodingClient(client, std::move(code));
}

StatusOr<ps::PushPullHandle> GradientCodingClient::pushPull(
    uint64_t key, std::span<const std::span<const float>> gradients, std::span<float> out,
    ps::PushPullOptions options) {
  if (options.op != ps::ReduceOp::kSum) {
    return InvalidArgument("gradient coding: rounds are sums (the daemons reject averages)");
  }
  // Checked before the key's buffer is touched: a refused call must not change the memory a
  // push-pull still running on this key is sending.
  COFAB_RETURN_IF_ERROR(code_.checkEncode(client_->rank(), gradients, out.size()));
  std::vector<float>& enc = encoded_[key];
  enc.resize(out.size());
  COFAB_RETURN_IF_ERROR(code_.encode(client_->rank(), gradients, enc));
  return client_->pushPull(key, TensorView(enc.data(), enc.size(), DType::kF32),
                           TensorView(out.data(), out.size(), DType::kF32), options);
}

}  // namespace cofab::coded
