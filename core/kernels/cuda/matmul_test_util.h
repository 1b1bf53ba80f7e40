#pragma once
// Helpers of the matmul-side CUDA tests: device detection and an owned device array.

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "gtest/gtest.h"

namespace estuary::cuda::matmul_test {

inline bool HasCudaDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

// A device copy of a host vector; Download() reads it back (synchronously).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceArray(size_t size) : DeviceArray(std::vector<T>(size)) {}
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { (void)cudaFree(data_); }

  T* get() const { return data_; }
  size_t bytes() const { return size_ * sizeof(T) > 0 ? size_ * sizeof(T) : 1; }
  std::vector<T> Download() const {
    std::vector<T> out(size_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  size_t size_ = 0;
  T* data_ = nullptr;
};

}  // namespace estuary::cuda::matmul_test
