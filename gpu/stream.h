// Streams and device buffers with explicit ownership: an owned handle is destroyed with its
// object; a borrowed one (wrapping the caller's cudaStream_t or device pointer) never is.
//
// Handles are opaque (void*) so that code without CUDA headers can hold them. Without a usable
// GPU every create/allocate/copy reports Unavailable with the reason (gpu/device.h), so callers
// and tests can say why they skip. Move-only; one thread at a time per object.
#pragma once

#include <cstddef>

#include "core/status.h"

namespace cofab::gpu {

class Stream {
 public:
  // A new non-blocking stream on `device`, owned.
  static StatusOr<Stream> create(int device);
  // Wraps an existing cudaStream_t (nullptr = the legacy default stream); never destroyed here.
  static Stream borrow(void* cudaStream, int device) { return Stream(cudaStream, device, false); }

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  void* handle() const { return handle_; }
  int device() const { return device_; }
  bool owned() const { return owned_; }
  Status synchronize() const;

 private:
  Stream(void* h, int device, bool owned) : handle_(h), device_(device), owned_(owned) {}
  void reset();
  void* handle_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

class DeviceBuffer {
 public:
  // cudaMalloc'd, owned.
  static StatusOr<DeviceBuffer> allocate(size_t bytes, int device);
  // Stream-ordered, owned: taken from the device's memory pool in `stream`'s order
  // (cudaMallocAsync) and given back in the same order when destroyed (cudaFreeAsync), so work
  // queued on that stream before the destruction may still use it. For temporaries: a repeated
  // allocation is served from the pool in microseconds, where cudaMalloc/cudaFree cost tens to
  // hundreds and cudaFree waits for the whole device. The stream must outlive the buffer.
  static StatusOr<DeviceBuffer> allocateOn(size_t bytes, const Stream& stream);
  // The caller's device memory; never freed here.
  static DeviceBuffer borrow(void* ptr, size_t bytes, int device) {
    return DeviceBuffer(ptr, bytes, device, false);
  }

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  bool owned() const { return owned_; }

  // Asynchronous on `stream`; the host memory must stay valid until the stream has passed it.
  Status copyFromHost(const void* src, size_t bytes, const Stream& stream);
  Status copyToHost(void* dst, size_t bytes, const Stream& stream) const;

 private:
  DeviceBuffer(void* p, size_t bytes, int device, bool owned, void* freeStream = nullptr,
               bool streamOrdered = false)
      : data_(p),
        bytes_(bytes),
        device_(device),
        owned_(owned),
        streamOrdered_(streamOrdered),
        freeStream_(freeStream) {}
  void reset();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
  bool owned_ = false;
  bool streamOrdered_ = false;  // allocateOn: freed with cudaFreeAsync on freeStream_
  void* freeStream_ = nullptr;
};

}  // namespace cofab::gpu
