#include "coding/gradient/fractional_repetition.h"

#include <algorithm>

namespace cofab::coding {

StatusOr<FractionalRepetitionCode> FractionalRepetitionCode::create(
    const FractionalRepetitionOptions& o) {
  if (o.workers < 1 || o.stragglers < 0 || o.stragglers >= o.workers ||
      o.workers % (o.stragglers + 1) != 0) {
    return InvalidArgument(
        "fractional repetition gradient code needs workers >= 1, 0 <= "
        "stragglers < workers and (stragglers + 1) dividing workers; got n=" +
        std::to_string(o.workers) + " s=" + std::to_string(o.stragglers));
  }
  return FractionalRepetitionCode(o.workers, o.stragglers);
}

std::vector<int> FractionalRepetitionCode::partitionsOf(int worker) const {
  std::vector<int> p;
  if (worker < 0 || worker >= n_) return p;
  const int first = groupOf(worker) * (s_ + 1);
  for (int i = 0; i <= s_; ++i) p.push_back(first + i);
  return p;
}

Status FractionalRepetitionCode::checkEncode(int worker,
                                             std::span<const std::span<const float>> grads,
                                             size_t elements) const {
  if (worker < 0 || worker >= n_) {
    return InvalidArgument("gradient encode: worker " + std::to_string(worker) + " outside [0, " +
                           std::to_string(n_) + ")");
  }
  if (static_cast<int>(grads.size()) != s_ + 1) {
    return InvalidArgument("gradient encode: worker " + std::to_string(worker) + " needs " +
                           std::to_string(s_ + 1) + " partition gradients, got " +
                           std::to_string(grads.size()));
  }
  for (const auto& g : grads) {
    if (g.size() != elements) {
      return InvalidArgument("gradient encode: partition gradient has " + std::to_string(g.size()) +
                             " elements, output " + std::to_string(elements));
    }
  }
  return OkStatus();
}

Status FractionalRepetitionCode::encode(int worker, std::span<const std::span<const float>> grads,
                                        std::span<float> out) const {
  COFAB_RETURN_IF_ERROR(checkEncode(worker, grads, out.size()));
  std::copy(grads[0].begin(), grads[0].end(), out.begin());
  for (size_t p = 1; p < grads.size(); ++p) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += grads[p][i];
  }
  return OkStatus();
}

GradientDecoder::GradientDecoder(const FractionalRepetitionCode& code, size_t elements)
    : code_(code),
      elements_(elements),
      groupSum_(code.groups()),
      seenWorker_(code.workers(), false),
      groupDone_(code.groups(), false) {}

StatusOr<bool> GradientDecoder::add(int worker, std::span<const float> message) {
  if (worker < 0 || worker >= code_.workers()) {
    return InvalidArgument("gradient decode: worker " + std::to_string(worker) + " outside [0, " +
                           std::to_string(code_.workers()) + ")");
  }
  if (message.size() != elements_) {
    return InvalidArgument("gradient decode: worker " + std::to_string(worker) + " sent " +
                           std::to_string(message.size()) + " elements, expected " +
                           std::to_string(elements_));
  }
  if (seenWorker_[worker]) {
    return InvalidArgument("gradient decode: worker " + std::to_string(worker) +
                           " delivered twice");
  }
  seenWorker_[worker] = true;
  const int g = code_.groupOf(worker);
  // A replica of a group already decoded is the redundancy that tolerated a straggler: unused.
  if (groupDone_[g]) return false;
  groupDone_[g] = true;
  groupSum_[g].assign(message.begin(), message.end());
  used_.push_back(worker);
  ++groupsDone_;
  return true;
}

Status GradientDecoder::finish(std::span<float> out) const {
  if (!complete()) {
    std::string missing;
    for (int g = 0; g < code_.groups(); ++g) {
      if (!groupDone_[g]) missing += (missing.empty() ? "" : ",") + std::to_string(g);
    }
    return FailedPrecondition("gradient decode: no worker of group(s) " + missing +
                              " has delivered yet (more than s=" +
                              std::to_string(code_.stragglers()) + " stragglers so far)");
  }
  if (out.size() != elements_) {
    return InvalidArgument("gradient decode: output has " + std::to_string(out.size()) +
                           " elements, expected " + std::to_string(elements_));
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (const auto& g : groupSum_) {
    for (size_t i = 0; i < elements_; ++i) out[i] += g[i];
  }
  return OkStatus();
}

}  // namespace cofab::coding
