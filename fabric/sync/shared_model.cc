#include "fabric/sync/shared_model.h"

#include <algorithm>
#include <cstddef>

#include "core/check.h"

namespace cofab::sync {

void SharedModel::assign(std::span<const float> values) {
  size_ = values.size();
  if (access_ == Access::kSingleThread) {
    plain_.assign(values.begin(), values.end());
    return;
  }
  data_ = std::make_unique<std::atomic<float>[]>(size_);
  for (size_t i = 0; i < size_; ++i) data_[i].store(values[i], std::memory_order_relaxed);
}

void SharedModel::read(std::span<float> out) const { read(0, out); }

void SharedModel::read(size_t offset, std::span<float> out) const {
  COFAB_CHECK(offset + out.size() <= size_);
  if (access_ == Access::kSingleThread) {
    std::copy_n(plain_.begin() + std::ptrdiff_t(offset), out.size(), out.begin());
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = data_[offset + i].load(std::memory_order_relaxed);
  }
}

void SharedModel::write(size_t offset, std::span<const float> values) {
  COFAB_CHECK(offset + values.size() <= size_);
  if (access_ == Access::kSingleThread) {
    std::copy(values.begin(), values.end(), plain_.begin() + std::ptrdiff_t(offset));
    return;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    data_[offset + i].store(values[i], std::memory_order_relaxed);
  }
}

void SharedModel::add(std::span<const float> delta, float scale) { add(0, delta, scale); }

void SharedModel::add(size_t offset, std::span<const float> delta, float scale) {
  COFAB_CHECK(offset + delta.size() <= size_);
  if (access_ == Access::kSingleThread) {
    float* dst = plain_.data() + offset;
    for (size_t i = 0; i < delta.size(); ++i) dst[i] += scale * delta[i];
    return;
  }
  for (size_t i = 0; i < delta.size(); ++i) {
    data_[offset + i].fetch_add(scale * delta[i], std::memory_order_relaxed);
  }
}

std::span<const float> Momentum::update(std::span<const float> grad) {
  COFAB_CHECK(grad.size() == velocity_.size());
  for (size_t i = 0; i < grad.size(); ++i) velocity_[i] = momentum_ * velocity_[i] + grad[i];
  return velocity_;
}

void Momentum::updateScaled(std::span<const float> grad, float scale, std::span<float> out) {
  COFAB_CHECK(grad.size() == velocity_.size() && out.size() == grad.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    velocity_[i] = momentum_ * velocity_[i] + grad[i];
    out[i] = scale * velocity_[i];
  }
}

std::span<const float> Momentum::nesterovUpdate(std::span<const float> grad) {
  update(grad);
  lookahead_.resize(grad.size());
  for (size_t i = 0; i < grad.size(); ++i) lookahead_[i] = grad[i] + momentum_ * velocity_[i];
  return lookahead_;
}

}  // namespace cofab::sync
