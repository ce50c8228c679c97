// GradientCodingClient: the worker side of gradient coding through the aggregator daemons
// (cofab-aggd --gradient-stragglers s; aggregator/gradient_groups.h). Worker `rank` computes the
// gradients of its s+1 data partitions (partitions(): the fractional-repetition assignment of
// coding/gradient/fractional_repetition.h), and pushPull() sends their sum; the daemons complete
// the round from one contribution per group, so the result — the full gradient sum over all n
// partitions — arrives without waiting for up to s stragglers. A straggler that pushes for the
// round just finished gets that round's result (a late resend); one further behind is rejected
// as a finished iteration and should skip ahead (PushPullOptions::iteration) instead.
//
// Ownership: borrows the client; owns one encoded buffer per key, lent to the operation until
// the next pushPull() on that key (so wait for a handle before reusing its key). Threads: one
// thread at a time (like the trainer loop that calls it).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "coding/gradient/fractional_repetition.h"
#include "fabric/ps/push_pull.h"

namespace cofab::coded {

// Keys from here up are create()'s probes (one per daemon); keep your own keys below.
inline constexpr uint64_t kGradientCodingCheckKeys = 0xFFFF'FFFF'0000'0000ull;

// Collective: every worker calls it once per client. Push-pulls 1.0 on one probe key per daemon
// (the first keys from `firstKey` up whose chunk 0 each daemon owns) and checks that every
// daemon completed the round from one contribution per group of `code`, i.e. runs cofab-aggd
// --gradient-stragglers s with the same s. FailedPrecondition naming the daemon, what it summed
// and the flag to start it with; the push-pull's own error otherwise: at `deadline`,
// DeadlineExceeded naming the probe chunks and daemons still waiting (it cannot name the workers
// that never probed: the daemons' round timeout does, in the Aborted it sends, when it comes
// first). Without it a daemon with another s (or none) returns
// a multiple of the gradient, silently. A probe still running at the deadline is cancelled by
// closing `client` (ps::waitEveryHandle): after such a failure, connect a new client.
Status checkDaemonsRunTheCode(ps::PushPullClient& client,
                              const coding::FractionalRepetitionCode& code, uint64_t firstKey,
                              Deadline deadline);

class GradientCodingClient {
 public:
  // Collective (checkDaemonsRunTheCode() on kGradientCodingCheckKeys): every worker creates its
  // client with the same s, and the daemons must run that code. InvalidArgument unless the
  // client's world size fits the code; FailedPrecondition when the daemons run another.
  static StatusOr<GradientCodingClient> create(ps::PushPullClient* client, int stragglers,
                                               Deadline deadline = Deadline::afterMs(60000));

  const coding::FractionalRepetitionCode& code() const { return code_; }
  // The data partitions (of n) whose gradients this worker computes, in the order pushPull()
  // takes them.
  std::vector<int> partitions() const { return code_.partitionsOf(client_->rank()); }

  // Encodes the partition gradients (f32, equal lengths = out.size()) and push-pulls the coded
  // sum as a plain f32 sum; `out` receives the full gradient sum over all partitions.
  // InvalidArgument for the wrong number or length of gradients, or a non-sum op.
  StatusOr<ps::PushPullHandle> pushPull(uint64_t key,
                                        std::span<const std::span<const float>> gradients,
                                        std::span<float> out, ps::PushPullOptions options = {});

 private:
  GradientCodingClient(ps::PushPullClient* c, coding::FractionalRepetitionCode code)
      : client_(c), code_(std::move(code)) {}
  ps::PushPullClient* client_;
  coding::FractionalRepetitionCode code_;
  std::map<uint64_t, std::vector<float>> encoded_;
};

}  // namespace cofab::coded
