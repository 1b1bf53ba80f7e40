# Element-wise CUDA kernels (elementwise.h): the fused residual add + RMSNorm + state-transition
# similarity, RoPE, SwiGLU, embedding, device argmax/sampling and KV page copies. elementwise.cu
# holds the kernels (nvcc, C++17, no Abseil); elementwise.cc checks arguments and returns
# absl::Status (C++20).
add_library(estuary_kernels_cuda_elementwise STATIC elementwise.cc elementwise.cu)
add_library(estuary::kernels_cuda_elementwise ALIAS estuary_kernels_cuda_elementwise)
target_include_directories(estuary_kernels_cuda_elementwise PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(estuary_kernels_cuda_elementwise
  PUBLIC CUDA::cudart estuary::tensor estuary::dtype absl::status absl::span
  PRIVATE absl::strings)
estuary_apply_flags(estuary_kernels_cuda_elementwise)

# Compared against the CPU kernels and sampler; skips without a device.
estuary_cc_test(NAME cuda_elementwise_test SRCS elementwise_test.cc
  DEPS estuary::kernels_cuda_elementwise estuary::kernels_cpu estuary::sampling estuary::tensor
       estuary::testing_data
  LABELS gpu)
