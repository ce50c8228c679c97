// GradientGroups: gradient coding in the aggregator (fractional repetition, Tandon et al.; the
// code itself is coding/gradient/fractional_repetition.h). With `cofab-aggd --gradient-stragglers
// s`, workers form n/(s+1) groups of s+1 consecutive ranks; every worker of a group pushes the
// same coded partial gradient (the sum over the group's s+1 data partitions), so a round is
// complete as soon as every group has one durable contribution: up to s stragglers (any s, one
// per group or not) are not waited for. The round's result is the sum of one contribution per
// group — the lowest durable rank of each group, folded in group order (reducer.h), so it does
// not depend on which replica arrived first — which is the full gradient sum over all n
// partitions. Late pushes of stragglers for the round just finished are answered from its result
// like any resend (engine.h).
//
// Immutable after create(); used by the engine thread (Engine owns one).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace cofab::aggregator {

class GradientGroups {
 public:
  // Disabled: every worker is needed (the plain aggregator).
  GradientGroups() = default;
  // s < 0: disabled. Else InvalidArgument unless (s + 1) divides workers.
  static StatusOr<GradientGroups> create(int workers, int stragglers);

  bool enabled() const { return groupSize_ > 0; }
  int groups() const { return enabled() ? workers_ / groupSize_ : 0; }
  int groupOf(int rank) const { return rank / groupSize_; }

  // state[r] == 2: worker r's contribution is durable (engine.cc's slot state).
  bool covered(std::span<const uint8_t> state) const;
  // Whether worker r's group already has a durable contribution.
  bool groupCovered(std::span<const uint8_t> state, int rank) const;
  // Whether worker r's group has, or may still get, a contribution: one is pushed (durable or
  // awaiting the backup's ack), or a member that is not gone (goneSinceNs[q] == 0) may still
  // push. A lost worker whose group may be covered is not a reason to fail the round.
  bool groupMayBeCovered(std::span<const uint8_t> state, std::span<const int64_t> goneSinceNs,
                         int rank) const;
  // The ranks whose contributions are reduced, one per group in group order (covered() first).
  std::vector<int> chosen(std::span<const uint8_t> state) const;

 private:
  int workers_ = 0;
  int groupSize_ = 0;
};

}  // namespace cofab::aggregator
