#include "core/kernels/cuda/int4_matmul.h"

#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/kernels/cuda/cuda_status.h"
#include "core/tensor/half_float.h"

namespace estuary::cuda {
namespace {

using kernels_internal::CudaStatus;

// The f16 bits h with F16ToF32(h) * multiplier == value, or false when there is none.
bool ExactF16(float value, float multiplier, uint16_t* out) {
  const uint16_t h = F32ToF16(value / multiplier);
  if (F16ToF32(h) * multiplier != value) return false;
  *out = h;
  return true;
}

absl::Status CheckView(const Int4GpuView& w, const void* x, int64_t n_tokens, const float* y) {
  if (absl::Status s = CheckInt4GpuView(w, "Int4MatMul", /*check_pointers=*/false); !s.ok()) {
    return s;
  }
  if (n_tokens < 0 || n_tokens > int64_t{65535} * 8) {
    return absl::InvalidArgumentError(absl::StrCat("Int4MatMul: bad n_tokens ", n_tokens));
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) return absl::InvalidArgumentError("Int4MatMul: null pointer");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return absl::InvalidArgumentError("Int4MatMul: x must be 16-byte aligned");
  }
  return CheckInt4GpuView(w, "Int4MatMul", /*check_pointers=*/true);
}

absl::Status Run(const Int4GpuView& w, const void* x, bool bf16, int64_t n_tokens,
                 const int32_t* row_path, int32_t want_path, float* y, cudaStream_t stream) {
  if (absl::Status s = CheckView(w, x, n_tokens, y); !s.ok()) return s;
  if (n_tokens == 0) return absl::OkStatus();
  return CudaStatus(matmul_internal::LaunchInt4MatMulRows(w, x, bf16, n_tokens, row_path,
                                                          want_path, y, stream),
                    "Int4MatMul launch");
}

}  // namespace

absl::Status CheckInt4GpuView(const Int4GpuView& w, absl::string_view what,
                              bool check_pointers) {
  if (w.rows <= 0 || w.cols <= 0 || w.cols % 32 != 0 || w.group_size <= 0 ||
      w.group_size % 32 != 0 || w.rows >= (int64_t{1} << 31) || w.cols >= (int64_t{1} << 31) ||
      w.n_groups != (w.cols + w.group_size - 1) / w.group_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad weight shape rows=", w.rows,
                                                   " cols=", w.cols, " group=", w.group_size,
                                                   " n_groups=", w.n_groups));
  }
  if (!check_pointers) return absl::OkStatus();
  if (w.nibbles == nullptr || w.scales == nullptr || w.offsets == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null pointer"));
  }
  if (reinterpret_cast<uintptr_t>(w.nibbles) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": nibbles must be 16-byte aligned"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Int4GpuHost> PackInt4ForGpu(const Int4Matrix& matrix) {
  if (matrix.empty()) return absl::InvalidArgumentError("PackInt4ForGpu: empty matrix");
  const int64_t rows = matrix.rows();
  const int64_t cols = matrix.cols();
  const int64_t gs = matrix.group_size();
  if (cols % 32 != 0 || gs % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PackInt4ForGpu: cols (", cols, ") and group_size (", gs, ") must be multiples of 32"));
  }
  Int4GpuHost out;
  out.rows = rows;
  out.cols = cols;
  out.group_size = gs;
  out.n_groups = matrix.n_groups();
  out.multiplier = matrix.param_multiplier();
  out.nibbles.assign(static_cast<size_t>(rows * cols / 2), 0);
  out.scales.resize(static_cast<size_t>(rows * out.n_groups));
  out.offsets.resize(static_cast<size_t>(rows * out.n_groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < out.n_groups; ++g) {
      const size_t i = static_cast<size_t>(r * out.n_groups + g);
      if (!ExactF16(matrix.Scale(r, g), out.multiplier, &out.scales[i]) ||
          !ExactF16(matrix.Offset(r, g), out.multiplier, &out.offsets[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PackInt4ForGpu: (s, m) of row ", r, " group ", g, " is not f16 * multiplier"));
      }
    }
    uint8_t* row = out.nibbles.data() + r * cols / 2;
    for (int64_t c = 0; c < cols; ++c) {
      // Column c: chunk c / 32, word (c % 32) / 8, nibble c % 8 → byte 4 * word + nibble / 2 of
      // the chunk (little-endian), high half for odd nibbles.
      const int64_t k = c / 32;
      const int64_t word = (c % 32) / 8;
      const int64_t j = c % 8;
      const int64_t byte = k * 16 + word * 4 + j / 2;
      row[byte] |= static_cast<uint8_t>((matrix.Code(r, c) & 15) << (4 * (j % 2)));
    }
  }
  return out;
}

absl::StatusOr<Int4GpuHost> QuantizeInt4ForGpu(const Tensor& weight, int group_size,
                                               int threads) {
  Int4QuantOptions options;
  options.group_size = group_size;
  options.refine = false;
  options.threads = threads;
  absl::StatusOr<Int4Matrix> m = Int4Matrix::Quantize(weight, options);
  if (!m.ok()) return m.status();
  return PackInt4ForGpu(*m);
}

absl::StatusOr<Int4GpuMatrix> Int4GpuMatrix::Upload(const Int4GpuHost& host) {
  const size_t n_params = static_cast<size_t>(host.rows * host.n_groups);
  if (host.rows <= 0 || host.cols <= 0 || host.cols % 32 != 0 ||
      host.nibbles.size() != static_cast<size_t>(host.rows * host.cols / 2) ||
      host.scales.size() != n_params || host.offsets.size() != n_params) {
    return absl::InvalidArgumentError("Int4GpuMatrix::Upload: inconsistent Int4GpuHost");
  }
  const size_t nib_bytes = host.nibbles.size();
  const size_t param_bytes = n_params * sizeof(uint16_t);
  const size_t scales_at = (nib_bytes + 255) / 256 * 256;
  const size_t offsets_at = scales_at + (param_bytes + 255) / 256 * 256;
  const size_t total = offsets_at + param_bytes;
  Int4GpuMatrix out;
  if (absl::Status s = CudaStatus(cudaMalloc(&out.memory_, total), "cudaMalloc"); !s.ok()) {
    out.memory_ = nullptr;
    return s;
  }
  out.bytes_ = static_cast<int64_t>(total);
  auto* base = static_cast<uint8_t*>(out.memory_);
  struct Piece {
    void* dst;
    const void* src;
    size_t bytes;
  };
  const Piece pieces[] = {{base, host.nibbles.data(), nib_bytes},
                          {base + scales_at, host.scales.data(), param_bytes},
                          {base + offsets_at, host.offsets.data(), param_bytes}};
  for (const Piece& p : pieces) {
    if (absl::Status s =
            CudaStatus(cudaMemcpy(p.dst, p.src, p.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        !s.ok()) {
      return s;
    }
  }
  out.view_.nibbles = base;
  out.view_.scales = reinterpret_cast<const uint16_t*>(base + scales_at);
  out.view_.offsets = reinterpret_cast<const uint16_t*>(base + offsets_at);
  out.view_.rows = host.rows;
  out.view_.cols = host.cols;
  out.view_.group_size = host.group_size;
  out.view_.n_groups = host.n_groups;
  out.view_.multiplier = host.multiplier;
  return out;
}

Int4GpuMatrix& Int4GpuMatrix::operator=(Int4GpuMatrix&& other) noexcept {
  if (this != &other) {
    if (memory_ != nullptr) (void)cudaFree(memory_);
    memory_ = std::exchange(other.memory_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    view_ = std::exchange(other.view_, Int4GpuView{});
  }
  return *this;
}

Int4GpuMatrix::~Int4GpuMatrix() {
  if (memory_ != nullptr) (void)cudaFree(memory_);
}

absl::Status Int4MatMul(const Int4GpuView& w, const float* x, int64_t n_tokens, float* y,
                        cudaStream_t stream) {
  return Run(w, x, /*bf16=*/false, n_tokens, /*row_path=*/nullptr, /*want_path=*/0, y, stream);
}

absl::Status Int4MatMul(const Int4GpuView& w, const uint16_t* x_bf16, int64_t n_tokens, float* y,
                        cudaStream_t stream) {
  return Run(w, x_bf16, /*bf16=*/true, n_tokens, /*row_path=*/nullptr, /*want_path=*/0, y,
             stream);
}

absl::Status Int4MatMul(const Int4GpuView& w, const float* x, int64_t n_tokens,
                        const int32_t* row_path, int32_t want_path, float* y,
                        cudaStream_t stream) {
  return Run(w, x, /*bf16=*/false, n_tokens, row_path, want_path, y, stream);
}

absl::Status Int4MatMul(const Int4GpuView& w, const uint16_t* x_bf16, int64_t n_tokens,
                        const int32_t* row_path, int32_t want_path, float* y,
                        cudaStream_t stream) {
  return Run(w, x_bf16, /*bf16=*/true, n_tokens, row_path, want_path, y, stream);
}

}  // namespace estuary::cuda
