#include "core/kernels/cuda/matmul.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/kernels/cuda/cuda_status.h"
#include "core/kernels/cuda/matmul_kernels.h"

namespace estuary::cuda {
namespace {

using kernels_internal::CudaStatus;

absl::Status CheckGemmArgs(const void* w, int64_t out_features, int64_t in_features,
                           const void* x, int64_t n_tokens, const float* y) {
  if (out_features < 0 || in_features < 0 || n_tokens < 0 || out_features > INT_MAX ||
      in_features > INT_MAX || n_tokens > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("MatMulBf16: bad sizes out=", out_features,
                                                   " in=", in_features, " n=", n_tokens));
  }
  if (n_tokens > 0 && out_features > 0 && (w == nullptr || x == nullptr || y == nullptr)) {
    return absl::InvalidArgumentError("MatMulBf16: null pointer");
  }
  return absl::OkStatus();
}

absl::Status Gemm(CublasHandle& handle, const uint16_t* w, int64_t out_features,
                  int64_t in_features, const uint16_t* x, int64_t n_tokens, float* y) {
  // Column-major view: C (out × n, ldc = out) = op(A) · B with A = W as a col-major in × out
  // matrix (lda = in) transposed, B = x as a col-major in × n matrix (ldb = in).
  const float alpha = 1.0f;
  const float beta = 0.0f;
  const int m = static_cast<int>(out_features);
  const int n = static_cast<int>(n_tokens);
  const int k = static_cast<int>(in_features);
  const int ld = k > 0 ? k : 1;  // cuBLAS wants lda, ldb >= 1
  const cublasStatus_t st =
      cublasGemmEx(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_16BF, ld, x,
                   CUDA_R_16BF, ld, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  return CublasStatusToStatus(st, "cublasGemmEx");
}

}  // namespace

absl::Status CublasStatusToStatus(int cublas_status, absl::string_view what) {
  const auto st = static_cast<cublasStatus_t>(cublas_status);
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusName(st), " (",
                                          cublasGetStatusString(st), ")"));
}

absl::StatusOr<CublasHandle> CublasHandle::Create(cudaStream_t stream) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();  // clear the sticky-free error of a failed device query
    return absl::UnavailableError("CublasHandle: no CUDA device");
  }
  CublasHandle h;
  cublasHandle_t raw = nullptr;
  const cublasStatus_t st = cublasCreate(&raw);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return absl::UnavailableError(CublasStatusToStatus(st, "cublasCreate").message());
  }
  h.handle_ = raw;
  h.stream_ = stream;
  if (absl::Status s = CublasStatusToStatus(cublasSetStream(raw, stream), "cublasSetStream");
      !s.ok()) {
    return s;
  }
  return h;
}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    Reset();
    handle_ = std::exchange(other.handle_, nullptr);
    stream_ = std::exchange(other.stream_, nullptr);
    scratch_ = std::exchange(other.scratch_, nullptr);
    scratch_bytes_ = std::exchange(other.scratch_bytes_, 0);
    workspace_ = std::exchange(other.workspace_, nullptr);
  }
  return *this;
}

CublasHandle::~CublasHandle() { Reset(); }

void CublasHandle::Reset() {
  if (scratch_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  if (handle_ != nullptr) {
    (void)cublasDestroy(handle_);
    handle_ = nullptr;
  }
  if (workspace_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaFree(workspace_);
    workspace_ = nullptr;
  }
}

absl::Status CublasHandle::PrepareForCapture(size_t max_scratch_bytes, size_t workspace_bytes) {
  if (handle_ == nullptr) return absl::FailedPreconditionError("PrepareForCapture: empty handle");
  if (absl::StatusOr<void*> scratch = Scratch(max_scratch_bytes); !scratch.ok()) {
    return scratch.status();
  }
  if (workspace_ != nullptr) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaMalloc(&workspace_, workspace_bytes),
                                  "cuBLAS workspace of ", workspace_bytes, " bytes");
      !s.ok()) {
    workspace_ = nullptr;
    return s;
  }
  return CublasStatusToStatus(cublasSetWorkspace(handle_, workspace_, workspace_bytes),
                              "cublasSetWorkspace");
}

absl::StatusOr<void*> CublasHandle::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  if (scratch_ != nullptr) {
    if (absl::Status s = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        !s.ok()) {
      return s;
    }
    (void)cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  void* p = nullptr;
  if (absl::Status s =
          CudaStatus(cudaMalloc(&p, bytes), "CublasHandle scratch of ", bytes, " bytes");
      !s.ok()) {
    return s;
  }
  scratch_ = p;
  scratch_bytes_ = bytes;
  return p;
}

absl::Status MatMulBf16(CublasHandle& handle, const uint16_t* w_bf16, int64_t out_features,
                        int64_t in_features, const float* x, int64_t n_tokens, float* y) {
  if (absl::Status s = CheckGemmArgs(w_bf16, out_features, in_features, x, n_tokens, y); !s.ok()) {
    return s;
  }
  if (n_tokens == 0 || out_features == 0) return absl::OkStatus();
  if (handle.get() == nullptr) return absl::FailedPreconditionError("MatMulBf16: empty handle");
  const int64_t n = n_tokens * in_features;
  absl::StatusOr<void*> scratch = handle.Scratch(static_cast<size_t>(n) * sizeof(uint16_t));
  if (!scratch.ok()) return scratch.status();
  auto* xb = static_cast<uint16_t*>(*scratch);
  if (absl::Status s = CudaStatus(matmul_internal::LaunchF32ToBf16(x, xb, n, handle.stream()),
                                  "F32ToBf16 launch");
      !s.ok()) {
    return s;
  }
  return Gemm(handle, w_bf16, out_features, in_features, xb, n_tokens, y);
}

absl::Status MatMulBf16(CublasHandle& handle, const uint16_t* w_bf16, int64_t out_features,
                        int64_t in_features, const uint16_t* x_bf16, int64_t n_tokens, float* y) {
  if (absl::Status s = CheckGemmArgs(w_bf16, out_features, in_features, x_bf16, n_tokens, y);
      !s.ok()) {
    return s;
  }
  if (n_tokens == 0 || out_features == 0) return absl::OkStatus();
  if (handle.get() == nullptr) return absl::FailedPreconditionError("MatMulBf16: empty handle");
  return Gemm(handle, w_bf16, out_features, in_features, x_bf16, n_tokens, y);
}

}  // namespace estuary::cuda
