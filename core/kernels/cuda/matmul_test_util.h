#pragma once
// Helpers of the matmul-side CUDA tests (and of the decode-step tests built on those products):
// device detection, an owned device array, and an int4 quantization with its CPU references.

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kernels/cuda/int4_matmul.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/tensor.h"
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

// An int4 view of the given shape (n_groups = ceil(cols / group_size)) that points nowhere: for
// argument checks.
inline Int4GpuView Int4ViewOfShape(int64_t rows, int64_t cols, int64_t group_size) {
  Int4GpuView v;
  v.rows = rows;
  v.cols = cols;
  v.group_size = group_size;
  v.n_groups = (cols + group_size - 1) / group_size;
  return v;
}

// An RTN int4 quantization of a host f32 weight (Int4Matrix::Quantize with {group_size,
// refine = false}, as QuantizeInt4ForGpu), its GPU packing and the dequantized weights the
// reference products use.
struct QuantizedInt4 {
  Int4Matrix matrix;
  Int4GpuHost host;                // PackInt4ForGpu(matrix)
  std::vector<float> dequantized;  // matrix.DequantizeToF32(), [rows][cols]
};

inline absl::StatusOr<QuantizedInt4> QuantizeInt4(const Tensor& w, int group_size) {
  Int4QuantOptions options;
  options.group_size = group_size;
  options.refine = false;
  absl::StatusOr<Int4Matrix> m = Int4Matrix::Quantize(w, options);
  if (!m.ok()) return m.status();
  absl::StatusOr<Int4GpuHost> host = PackInt4ForGpu(*m);
  if (!host.ok()) return host.status();
  absl::StatusOr<Tensor> w_hat = m->DequantizeToF32();
  if (!w_hat.ok()) return w_hat.status();
  QuantizedInt4 out;
  out.dequantized.assign(w_hat->data<float>(), w_hat->data<float>() + w_hat->numel());
  out.matrix = std::move(*m);
  out.host = std::move(*host);
  return out;
}

// |s| q + |m| of every element of `m`, [rows][cols]: the weights' side of the int4 error bound
// 2e-5 · Σ_i |x_i| (|s| q_i + |m|) + 1e-6.
inline std::vector<float> Int4Magnitudes(const Int4Matrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows() * m.cols()));
  for (int64_t r = 0; r < m.rows(); ++r) {
    for (int64_t i = 0; i < m.cols(); ++i) {
      const int64_t g = i / m.group_size();
      out[static_cast<size_t>(r * m.cols() + i)] =
          std::fabs(m.Scale(r, g)) * static_cast<float>(m.Code(r, i)) + std::fabs(m.Offset(r, g));
    }
  }
  return out;
}

}  // namespace estuary::cuda::matmul_test
