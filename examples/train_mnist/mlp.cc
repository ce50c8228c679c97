#include "examples/train_mnist/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace cofab::examples {

Mlp::Mlp(int inputs, int hidden, int classes, uint64_t seed)
    : inputs_(inputs), hidden_(hidden), classes_(classes) {
  size_t w1 = size_t(inputs) * hidden, b1 = hidden, w2 = size_t(hidden) * classes, b2 = classes;
  tensors_ = {{"w1", 0, w1}, {"b1", w1, b1}, {"w2", w1 + b1, w2}, {"b2", w1 + b1 + w2, b2}};
  params_.assign(w1 + b1 + w2 + b2, 0.0f);
  std::mt19937_64 rng(seed);
  // He initialisation for the ReLU layer, Xavier for the output layer.
  std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / inputs));
  std::normal_distribution<float> n2(0.0f, std::sqrt(1.0f / hidden));
  for (size_t i = 0; i < w1; ++i) params_[i] = n1(rng);
  for (size_t i = 0; i < w2; ++i) params_[w1 + b1 + i] = n2(rng);
}

void Mlp::forward(const float* x, int n) {
  const float* w1 = params_.data();
  const float* b1 = w1 + size_t(inputs_) * hidden_;
  const float* w2 = b1 + hidden_;
  const float* b2 = w2 + size_t(hidden_) * classes_;
  hidden_act_.resize(size_t(n) * hidden_);
  logits_.resize(size_t(n) * classes_);
  // H = relu(X W1 + b1): X is n x inputs, W1 inputs x hidden (row-major).
  for (int i = 0; i < n; ++i) std::copy(b1, b1 + hidden_, hidden_act_.data() + size_t(i) * hidden_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hidden_, inputs_, 1.0f, x, inputs_, w1,
              hidden_, 1.0f, hidden_act_.data(), hidden_);
  for (float& v : hidden_act_) v = std::max(v, 0.0f);
  for (int i = 0; i < n; ++i) std::copy(b2, b2 + classes_, logits_.data() + size_t(i) * classes_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, classes_, hidden_, 1.0f,
              hidden_act_.data(), hidden_, w2, classes_, 1.0f, logits_.data(), classes_);
}

double Mlp::gradient(const float* x, const uint8_t* labels, int n, float normaliser, float* grads) {
  std::fill(grads, grads + params_.size(), 0.0f);
  if (n == 0) return 0.0;
  forward(x, n);
  const float* w2 = params_.data() + size_t(inputs_) * hidden_ + hidden_;
  float* gw1 = grads;
  float* gb1 = gw1 + size_t(inputs_) * hidden_;
  float* gw2 = gb1 + hidden_;
  float* gb2 = gw2 + size_t(hidden_) * classes_;
  dlogits_.resize(size_t(n) * classes_);
  double loss = 0;
  const float scale = 1.0f / normaliser;
  for (int i = 0; i < n; ++i) {
    const float* z = logits_.data() + size_t(i) * classes_;
    float* dz = dlogits_.data() + size_t(i) * classes_;
    float m = *std::max_element(z, z + classes_);
    double sum = 0;
    for (int c = 0; c < classes_; ++c) sum += std::exp(double(z[c] - m));
    loss += std::log(sum) - double(z[labels[i]] - m);
    for (int c = 0; c < classes_; ++c) {
      float p = float(std::exp(double(z[c] - m)) / sum);
      dz[c] = (p - (c == labels[i] ? 1.0f : 0.0f)) * scale;
      gb2[c] += dz[c];
    }
  }
  // dW2 = H^T dZ ; dH = dZ W2^T masked by relu ; dW1 = X^T dH
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hidden_, classes_, n, 1.0f,
              hidden_act_.data(), hidden_, dlogits_.data(), classes_, 0.0f, gw2, classes_);
  dhidden_.resize(size_t(n) * hidden_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, hidden_, classes_, 1.0f, dlogits_.data(),
              classes_, w2, classes_, 0.0f, dhidden_.data(), hidden_);
  for (size_t i = 0; i < dhidden_.size(); ++i) {
    if (hidden_act_[i] <= 0.0f) dhidden_[i] = 0.0f;
  }
  for (int i = 0; i < n; ++i) {
    const float* dh = dhidden_.data() + size_t(i) * hidden_;
    for (int h = 0; h < hidden_; ++h) gb1[h] += dh[h];
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, inputs_, hidden_, n, 1.0f, x, inputs_,
              dhidden_.data(), hidden_, 0.0f, gw1, hidden_);
  return loss;
}

void Mlp::step(const float* grads, float lr) {
  cblas_saxpy(int(params_.size()), -lr, grads, 1, params_.data(), 1);
}

double Mlp::accuracy(const float* x, const uint8_t* labels, size_t n) {
  size_t correct = 0;
  constexpr size_t kChunk = 1000;
  for (size_t start = 0; start < n; start += kChunk) {
    int m = int(std::min(kChunk, n - start));
    forward(x + start * inputs_, m);
    for (int i = 0; i < m; ++i) {
      const float* z = logits_.data() + size_t(i) * classes_;
      correct += size_t(std::max_element(z, z + classes_) - z) == labels[start + i];
    }
  }
  return n == 0 ? 0.0 : double(correct) / double(n);
}

}  // namespace cofab::examples
