# Decode-step CUDA kernels (decode_step_kernels.h): the row-masked dense and int4 projections,
# the KV write into pages and the exit river's decision on the device, so that a whole decode
# step can be captured in a CUDA graph. decode_step_kernels.cu holds the kernels (nvcc, C++17,
# no Abseil); decode_step_kernels.cc checks arguments and returns absl::Status (C++20). The masked
# int4 kernel itself lives in the matmul library (int4_matmul_kernel.cu).
add_library(estuary_kernels_cuda_decode_step STATIC decode_step_kernels.cc decode_step_kernels.cu)
add_library(estuary::kernels_cuda_decode_step ALIAS estuary_kernels_cuda_decode_step)
target_include_directories(estuary_kernels_cuda_decode_step PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(estuary_kernels_cuda_decode_step
  PUBLIC
    estuary::kernels_cuda_matmul       # Int4GpuView, the masked int4 product
    estuary::kernels_cuda_elementwise  # PageShape
    estuary::dtype                     # RopeStyle (core/tensor/rope_types.h)
    estuary::tensor
    CUDA::cudart
    absl::status
    absl::span
  PRIVATE
    absl::strings)
estuary_apply_flags(estuary_kernels_cuda_decode_step)

# Compared against the CPU kernels (dense MatMul, CosineSimilarity), the int4 dequantization and
# host references; device tests skip without a device, argument checks run on the CPU.
estuary_cc_test(NAME decode_step_kernels_test SRCS decode_step_kernels_test.cc
  DEPS estuary::kernels_cuda_decode_step estuary::kernels_cpu estuary::quant estuary::tensor
       estuary::testing_data
  LABELS gpu)

# The fused launches (multi-segment products, SwiGLU on load, RoPE + KV write) against the
# separate calls they replace (bitwise) and the CPU kernels; argument checks run on the CPU.
estuary_cc_test(NAME decode_step_fused_test SRCS decode_step_fused_test.cc
  DEPS estuary::kernels_cuda_decode_step estuary::kernels_cuda_elementwise estuary::kernels_cpu
       estuary::quant estuary::tensor estuary::testing_data
  LABELS gpu)
