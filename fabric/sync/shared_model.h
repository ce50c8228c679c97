// SharedModel: a worker's model as floats, in one of two access modes.
//
// kConcurrent: several threads read and update it at once (Hogwild): training threads apply
// their SGD steps, a sync thread adds elastic or averaging corrections (eawild with more than one
// thread, shadowsync). Every element is a std::atomic<float> accessed with relaxed ordering, so
// the races Hogwild means (reads of a model that is being updated, interleaved updates of
// different threads) are well-defined and TSan-clean, and no update is lost (add() is an atomic
// read-modify-write per element). There is no consistency across elements, on purpose.
//
// kSingleThread: one thread owns the model (every other algorithm): plain floats, copied and
// updated by vectorised loops. Relaxed atomics are never vectorised and a float fetch_add is a
// compare-exchange loop, which made the model loops cost several times a memcpy on every
// training step (bench/sync/shared_model_bench; figures in bench/RESULTS.md, "Session 6").
//
// Momentum: a thread's SGD-with-momentum state (velocity), owned by that thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace cofab::sync {

class SharedModel {
 public:
  enum class Access { kConcurrent, kSingleThread };

  explicit SharedModel(Access access = Access::kConcurrent) : access_(access) {}
  explicit SharedModel(std::span<const float> init, Access access = Access::kConcurrent)
      : access_(access) {
    assign(init);
  }

  size_t size() const { return size_; }
  // Not concurrent with anything else (setup).
  void assign(std::span<const float> values);
  Access access() const { return access_; }
  // out[i] = model[i] (kConcurrent: relaxed loads).
  void read(std::span<float> out) const;
  void read(size_t offset, std::span<float> out) const;
  // model[offset + i] = values[i] (kConcurrent: relaxed stores; a concurrent add() may be
  // overwritten, which is why only single-writer algorithms use it).
  void write(size_t offset, std::span<const float> values);
  // model[i] += scale * delta[i] (kConcurrent: relaxed atomic adds).
  void add(std::span<const float> delta, float scale);
  void add(size_t offset, std::span<const float> delta, float scale);

 private:
  Access access_;
  std::unique_ptr<std::atomic<float>[]> data_;  // kConcurrent
  std::vector<float> plain_;                    // kSingleThread
  size_t size_ = 0;
};

class Momentum {
 public:
  Momentum(size_t n, float momentum) : velocity_(n, 0.0f), momentum_(momentum) {}
  // v = momentum * v + grad; returns v.
  std::span<const float> update(std::span<const float> grad);
  // Nesterov: v = momentum * v + grad as update(), but returns the look-ahead step
  // grad + momentum * v (valid until the next call). onebit quantizes this instead of v.
  std::span<const float> nesterovUpdate(std::span<const float> grad);
  // update(), and out = scale * v in the same pass (ssp's delta: one pass over the model's
  // size instead of two). `out` has the gradient's size.
  void updateScaled(std::span<const float> grad, float scale, std::span<float> out);

 private:
  std::vector<float> velocity_;
  std::vector<float> lookahead_;  // nesterovUpdate()'s result
  float momentum_;
};

}  // namespace cofab::sync
