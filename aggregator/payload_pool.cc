#include "aggregator/payload_pool.h"

namespace cofab::aggregator {

std::shared_ptr<PayloadPool> PayloadPool::create(size_t maxBytes) {
  return std::shared_ptr<PayloadPool>(new PayloadPool(maxBytes));
}

std::shared_ptr<std::vector<uint8_t>> PayloadPool::take(size_t bytes) {
  std::unique_ptr<std::vector<uint8_t>> buf;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(bytes);
    if (it != idle_.end() && !it->second.empty()) {
      buf = std::move(it->second.back());
      it->second.pop_back();
      idleBytes_ -= bytes;
    }
  }
  if (!buf) buf = std::make_unique<std::vector<uint8_t>>(bytes);
  std::weak_ptr<PayloadPool> weak = weak_from_this();
  return std::shared_ptr<std::vector<uint8_t>>(buf.release(), [weak](std::vector<uint8_t>* b) {
    if (auto pool = weak.lock()) {
      pool->give(b);
    } else {
      delete b;
    }
  });
}

void PayloadPool::give(std::vector<uint8_t>* buffer) {
  std::unique_ptr<std::vector<uint8_t>> b(buffer);
  const size_t bytes = b->size();
  // A buffer someone resized is no longer the size it is filed under: let it go.
  if (bytes == 0 || b->capacity() != bytes) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (idleBytes_ + bytes > maxBytes_) return;
  idleBytes_ += bytes;
  idle_[bytes].push_back(std::move(b));
}

size_t PayloadPool::idleBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idleBytes_;
}

}  // namespace cofab::aggregator
