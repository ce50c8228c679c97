// A two-layer perceptron (784 -> hidden -> 10, ReLU, softmax cross-entropy) whose matrix work
// goes through OpenBLAS. Parameters live in one contiguous float vector, split into named
// tensors (w1, b1, w2, b2) so that a data-parallel trainer can exchange gradients per tensor.
// Not thread-safe: one Mlp per training thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cofab::examples {

struct TensorSlot {
  std::string name;
  size_t offset;  // into params()/grads(), in floats
  size_t count;
};

class Mlp {
 public:
  Mlp(int inputs, int hidden, int classes, uint64_t seed);

  std::vector<float>& params() { return params_; }
  const std::vector<TensorSlot>& tensors() const { return tensors_; }

  // Forward and backward over `n` samples. Writes into `grads` (params().size() floats) the
  // gradient of sum(loss) / `normaliser` — pass the global batch size so that gradients summed
  // over data-parallel workers equal the single-process mean. Returns the summed loss.
  double gradient(const float* x, const uint8_t* labels, int n, float normaliser, float* grads);

  // params -= lr * grads
  void step(const float* grads, float lr);

  // Fraction of `n` samples classified correctly.
  double accuracy(const float* x, const uint8_t* labels, size_t n);

 private:
  void forward(const float* x, int n);

  int inputs_, hidden_, classes_;
  std::vector<float> params_;
  std::vector<TensorSlot> tensors_;
  std::vector<float> hidden_act_, logits_, dlogits_, dhidden_;  // scratch
};

}  // namespace cofab::examples
