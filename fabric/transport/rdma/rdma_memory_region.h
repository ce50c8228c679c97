// RdmaMemoryRegion: a MemoryRegion registered with a verbs protection domain (ibv_reg_mr), and
// RegistrationCache, which keeps registrations of buffers that are used again.
//
// RAII: the registration (pinning) lasts as long as the object; it holds the device, so the PD
// outlives it. The caller owns the memory and must keep it alive while the region exists.
// Created from any thread; lkey()/rkey() are immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

#include "core/status.h"
#include "fabric/transport/memory_region.h"
#include "fabric/transport/rdma/rdma_device.h"

namespace cofab::transport::rdma {

class RdmaMemoryRegion : public MemoryRegion {
 public:
  // `access`: ibv_access_flags; LOCAL_WRITE is always added (ibv_reg_mr(3) requires it for
  // REMOTE_WRITE, and receives write locally).
  static StatusOr<std::unique_ptr<RdmaMemoryRegion>> create(std::shared_ptr<RdmaDevice> device,
                                                           void* data, size_t size, int access);
  ~RdmaMemoryRegion() override;

  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }

 private:
  RdmaMemoryRegion(std::shared_ptr<RdmaDevice> device, ibv_mr* mr, void* data, size_t size)
      : MemoryRegion(data, size), device_(std::move(device)), mr_(mr) {}

  std::shared_ptr<RdmaDevice> device_;
  ibv_mr* mr_;
};

// Registrations of caller buffers that are seen again (the same gradient buffers every
// iteration): registering is a syscall plus page pinning, far too slow per message. Keeps up to
// `capacity` regions, least recently used evicted first. Thread-safe. A returned region stays
// valid while the caller holds the shared_ptr, even if evicted meanwhile.
class RegistrationCache {
 public:
  RegistrationCache(std::shared_ptr<RdmaDevice> device, size_t capacity)
      : device_(std::move(device)), capacity_(capacity) {}

  // A region covering [data, data + size): a cached one that contains it, else a new one.
  StatusOr<std::shared_ptr<RdmaMemoryRegion>> get(const void* data, size_t size);
  size_t size() const;
  uint64_t hits() const;

 private:
  std::shared_ptr<RdmaDevice> device_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<RdmaMemoryRegion>> lru_;  // front: most recently used
  uint64_t hits_ = 0;
};

}  // namespace cofab::transport::rdma
