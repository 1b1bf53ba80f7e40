# Matmul-side CUDA kernels (ESTUARY_CUDA only; included from CMakeLists.txt in this folder):
# the cuBLAS bf16 GEMM (matmul.h), the int4 W4A16 kernel (int4_matmul.h) and paged-attention
# decode (paged_attention.h). The .cu files hold only kernels and plain-typed launchers (C++17,
# no Abseil); the .cc wrappers turn CUDA / cuBLAS errors into absl::Status. Tests are labelled
# `gpu` and skip without a device.
add_library(estuary_kernels_cuda_matmul STATIC
  matmul.cc
  matmul_kernels.cu
  int4_matmul.cc
  int4_matmul_kernel.cu
  paged_attention.cc
  paged_attention_kernel.cu)
add_library(estuary::kernels_cuda_matmul ALIAS estuary_kernels_cuda_matmul)
target_include_directories(estuary_kernels_cuda_matmul PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(estuary_kernels_cuda_matmul
  PUBLIC
    estuary::quant
    estuary::tensor
    CUDA::cudart
    CUDA::cublas
    absl::status
    absl::statusor
  PRIVATE
    absl::strings)
estuary_apply_flags(estuary_kernels_cuda_matmul)

estuary_cc_test(NAME cuda_matmul_test SRCS matmul_test.cc
  DEPS estuary::kernels_cuda_matmul estuary::kernels_cpu LABELS gpu)
estuary_cc_test(NAME cuda_int4_matmul_test SRCS int4_matmul_test.cc
  DEPS estuary::kernels_cuda_matmul estuary::quant LABELS gpu)
estuary_cc_test(NAME cuda_paged_attention_test SRCS paged_attention_test.cc
  DEPS estuary::kernels_cuda_matmul estuary::kvcache LABELS gpu)
