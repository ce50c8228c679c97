#include "gpu/stream.h"

#include <utility>

#include "core/config.h"

#if COFAB_HAVE_CUDA
#include "gpu/cuda/cuda_status.h"
#endif

namespace cofab::gpu {
namespace {

[[maybe_unused]] Status noCuda(const char* what) {
  return Unavailable(std::string(what) +
                     ": cofab was built without CUDA (COFAB_WITH_CUDA=OFF or nvcc not found)");
}

}  // namespace

StatusOr<Stream> Stream::create(int device) {
#if COFAB_HAVE_CUDA
  COFAB_RETURN_IF_ERROR(cuda::setDevice(device));
  cudaStream_t s = nullptr;
  COFAB_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s, device, true);
#else
  (void)device;
  return noCuda("Stream::create");
#endif
}

Stream::Stream(Stream&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)),
      device_(o.device_),
      owned_(std::exchange(o.owned_, false)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    reset();
    handle_ = std::exchange(o.handle_, nullptr);
    device_ = o.device_;
    owned_ = std::exchange(o.owned_, false);
  }
  return *this;
}

Stream::~Stream() { reset(); }

void Stream::reset() {
#if COFAB_HAVE_CUDA
  if (owned_ && handle_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
#endif
  handle_ = nullptr;
  owned_ = false;
}

Status Stream::synchronize() const {
#if COFAB_HAVE_CUDA
  COFAB_RETURN_IF_ERROR(cuda::setDevice(device_));
  COFAB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
  return OkStatus();
#else
  return noCuda("Stream::synchronize");
#endif
}

StatusOr<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, int device) {
#if COFAB_HAVE_CUDA
  COFAB_RETURN_IF_ERROR(cuda::setDevice(device));
  void* p = nullptr;
  if (bytes > 0) COFAB_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return DeviceBuffer(p, bytes, device, true);
#else
  (void)bytes;
  (void)device;
  return noCuda("DeviceBuffer::allocate");
#endif
}

StatusOr<DeviceBuffer> DeviceBuffer::allocateOn(size_t bytes, const Stream& stream) {
#if COFAB_HAVE_CUDA
  COFAB_RETURN_IF_ERROR(cuda::setDevice(stream.device()));
  void* p = nullptr;
  if (bytes > 0) {
    COFAB_CUDA_RETURN_IF_ERROR(
        cudaMallocAsync(&p, bytes, static_cast<cudaStream_t>(stream.handle())));
  }
  return DeviceBuffer(p, bytes, stream.device(), true, stream.handle(), true);
#else
  (void)bytes;
  (void)stream;
  return noCuda("DeviceBuffer::allocateOn");
#endif
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      device_(o.device_),
      owned_(std::exchange(o.owned_, false)),
      streamOrdered_(std::exchange(o.streamOrdered_, false)),
      freeStream_(std::exchange(o.freeStream_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
    owned_ = std::exchange(o.owned_, false);
    streamOrdered_ = std::exchange(o.streamOrdered_, false);
    freeStream_ = std::exchange(o.freeStream_, nullptr);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() {
#if COFAB_HAVE_CUDA
  if (owned_ && data_ != nullptr) {
    if (streamOrdered_) {
      cudaFreeAsync(data_, static_cast<cudaStream_t>(freeStream_));
    } else {
      cudaFree(data_);
    }
  }
#endif
  data_ = nullptr;
  bytes_ = 0;
  owned_ = false;
  streamOrdered_ = false;
  freeStream_ = nullptr;
}

Status DeviceBuffer::copyFromHost(const void* src, size_t bytes, const Stream& stream) {
  if (bytes > bytes_) {
    return InvalidArgument("DeviceBuffer::copyFromHost: " + std::to_string(bytes) +
                           " bytes into a buffer of " + std::to_string(bytes_));
  }
#if COFAB_HAVE_CUDA
  COFAB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(data_, src, bytes, cudaMemcpyHostToDevice,
                                             static_cast<cudaStream_t>(stream.handle())));
  return OkStatus();
#else
  (void)src;
  (void)stream;
  return noCuda("DeviceBuffer::copyFromHost");
#endif
}

Status DeviceBuffer::copyToHost(void* dst, size_t bytes, const Stream& stream) const {
  if (bytes > bytes_) {
    return InvalidArgument("DeviceBuffer::copyToHost: " + std::to_string(bytes) +
                           " bytes from a buffer of " + std::to_string(bytes_));
  }
#if COFAB_HAVE_CUDA
  COFAB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, data_, bytes, cudaMemcpyDeviceToHost,
                                             static_cast<cudaStream_t>(stream.handle())));
  return OkStatus();
#else
  (void)dst;
  (void)stream;
  return noCuda("DeviceBuffer::copyToHost");
#endif
}

}  // namespace cofab::gpu
