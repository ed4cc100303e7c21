// Device memory and error plumbing of the CUDA backend (host side): CUDA errors become
// absl::Status here and never cross the kernels/ boundary as anything else.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace thetaserve::kernels::cuda {

inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("CUDA error in %s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

#define TS_CUDA_RETURN(expr)                                            \
  do {                                                                  \
    if (cudaError_t ts_cuda_err_ = (expr); ts_cuda_err_ != cudaSuccess) \
      return ::thetaserve::kernels::cuda::CudaStatus(ts_cuda_err_, #expr); \
  } while (0)

// A device allocation that only grows (plain cudaMalloc; contents are not kept on growth).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }

  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    const size_t old = bytes_;
    bytes_ = 0;
    // Grow by half again at least: steps whose needs creep up (page tables, hit marks growing
    // with the context) must not reallocate every step (cudaFree synchronizes the device, and
    // a new address invalidates captured CUDA graphs).
    const size_t wanted = std::max(bytes, old + old / 2);
    const size_t rounded = (std::max<size_t>(wanted, 64 << 10) + 255) / 256 * 256;
    if (cudaError_t e = cudaMalloc(&ptr_, rounded); e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cudaMalloc of %d bytes failed: %s", rounded, cudaGetErrorString(e)));
    }
    bytes_ = rounded;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory that only grows.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { if (ptr_) cudaFreeHost(ptr_); }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    const size_t rounded = (std::max<size_t>(bytes, 64 << 10) * 3 / 2 + 4095) / 4096 * 4096;
    if (cudaError_t e = cudaMallocHost(&ptr_, rounded); e != cudaSuccess) {
      cudaGetLastError();  // returned here: not left to fail the next launch's check
      ptr_ = nullptr;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cudaMallocHost of %d bytes of page-locked memory failed: %s", rounded,
          cudaGetErrorString(e)));
    }
    bytes_ = rounded;
    return absl::OkStatus();
  }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory mapped into the device's address space: kernels read and write it
// over the bus (the offload policy's host pool). Allocated once, at its full size.
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;
  ~MappedHostBuffer() { Free(); }
  absl::Status Allocate(size_t bytes) {
    Free();
    if (bytes == 0) return absl::OkStatus();
    if (cudaError_t e = cudaHostAlloc(&host_, bytes, cudaHostAllocMapped); e != cudaSuccess) {
      cudaGetLastError();
      host_ = nullptr;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cudaHostAlloc of %d bytes of mapped host memory failed: %s", bytes,
          cudaGetErrorString(e)));
    }
    TS_CUDA_RETURN(cudaHostGetDevicePointer(&device_, host_, 0));
    return absl::OkStatus();
  }
  void Free() {
    if (host_) cudaFreeHost(host_);
    host_ = device_ = nullptr;
  }
  template <typename T>
  T* device() const { return static_cast<T*>(device_); }
  template <typename T>
  T* host() const { return static_cast<T*>(host_); }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
};

}  // namespace thetaserve::kernels::cuda
