#include "fabric/transport/rdma/rdma_memory_region.h"

#include <cerrno>

namespace cofab::transport::rdma {

StatusOr<std::unique_ptr<RdmaMemoryRegion>> RdmaMemoryRegion::create(
    std::shared_ptr<RdmaDevice> device, void* data, size_t size, int access) {
  if (data == nullptr) {
    return InvalidArgument("rdma: registerMemory of a null pointer (" + std::to_string(size) +
                           " bytes)");
  }
  errno = 0;
  ibv_mr* mr =
      device->verbs().regMr(device->pd(), data, size, access | IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    // ibv_reg_mr(3): NULL on failure with errno (ENOMEM/EFAULT typically: the pinned-memory
    // limit, see `ulimit -l`, or an unmapped range).
    return verbsError(StatusCode::kResourceExhausted,
                      "ibv_reg_mr(" + std::to_string(size) + " bytes on " + device->name() + ")",
                      errno);
  }
  return std::unique_ptr<RdmaMemoryRegion>(
      new RdmaMemoryRegion(std::move(device), mr, data, size));
}

RdmaMemoryRegion::~RdmaMemoryRegion() {
  // ibv_dereg_mr(3) fails only while a memory window is bound (none are used here).
  device_->verbs().deregMr(mr_);
}

StatusOr<std::shared_ptr<RdmaMemoryRegion>> RegistrationCache::get(const void* data,
                                                                   size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if ((*it)->contains(data, size)) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it);
      return lru_.front();
    }
  }
  COFAB_ASSIGN_OR_RETURN(auto mr, RdmaMemoryRegion::create(device_, const_cast<void*>(data),
                                                           size, IBV_ACCESS_LOCAL_WRITE));
  lru_.emplace_front(std::move(mr));
  while (lru_.size() > capacity_) lru_.pop_back();
  return lru_.front();
}

size_t RegistrationCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

uint64_t RegistrationCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace cofab::transport::rdma
