#include "aggregator/gradient_groups.h"

#include <string>

#include "coding/gradient/fractional_repetition.h"

namespace cofab::aggregator {

StatusOr<GradientGroups> GradientGroups::create(int workers, int stragglers) {
  GradientGroups g;
  if (stragglers < 0) return g;
  // The code's own validation: the same rule the workers' encoders follow.
  StatusOr<coding::FractionalRepetitionCode> code =
      coding::FractionalRepetitionCode::create({.workers = workers, .stragglers = stragglers});
  if (!code.ok()) return code.status().withContext("--gradient-stragglers");
  g.workers_ = workers;
  g.groupSize_ = stragglers + 1;
  return g;
}

bool GradientGroups::groupCovered(std::span<const uint8_t> state, int rank) const {
  const int first = groupOf(rank) * groupSize_;
  for (int r = first; r < first + groupSize_; ++r) {
    if (state[static_cast<size_t>(r)] == 2) return true;
  }
  return false;
}

bool GradientGroups::groupMayBeCovered(std::span<const uint8_t> state,
                                       std::span<const int64_t> goneSinceNs, int rank) const {
  const int first = groupOf(rank) * groupSize_;
  for (int r = first; r < first + groupSize_; ++r) {
    const auto q = static_cast<size_t>(r);
    if (state[q] != 0 || goneSinceNs[q] == 0) return true;
  }
  return false;
}

bool GradientGroups::covered(std::span<const uint8_t> state) const {
  for (int g = 0; g < groups(); ++g) {
    if (!groupCovered(state, g * groupSize_)) return false;
  }
  return true;
}

std::vector<int> GradientGroups::chosen(std::span<const uint8_t> state) const {
  std::vector<int> out;
  for (int g = 0; g < groups(); ++g) {
    for (int r = g * groupSize_; r < (g + 1) * groupSize_; ++r) {
      if (state[static_cast<size_t>(r)] == 2) {
        out.push_back(r);
        break;
      }
    }
  }
  return out;
}

}  // namespace cofab::aggregator
