// GradientSync: how train_mnist's ranks combine their gradients each step. "local" is one
// process (nothing to combine); the distributed modes bootstrap from the launcher's environment.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "examples/train_mnist/mlp.h"

namespace cofab::examples {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  virtual std::string describe() const = 0;
  // Replaces `grads` (laid out as `tensors`) by the sum over all ranks for step `step`.
  virtual Status sumGradients(const std::vector<TensorSlot>& tensors, std::vector<float>& grads,
                              uint64_t step) = 0;
  // Called once after the last step (orderly shutdown of connections).
  virtual Status finish() { return OkStatus(); }
};

// "local", or a distributed mode listed by syncModes().
StatusOr<std::unique_ptr<GradientSync>> makeGradientSync(const std::string& mode);
// Every --sync value: the gradient paths makeGradientSync takes, then the sync algorithms.
std::string syncModes();
// Whether makeGradientSync takes `mode` (the sync algorithms run elsewhere: sync_training.h).
bool isGradientSyncMode(const std::string& mode);

}  // namespace cofab::examples
