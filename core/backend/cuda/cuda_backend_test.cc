// GPU tests (CTest label `gpu`): skip themselves when no device is visible.
#include <cuda_runtime.h>

#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cuda/cuda_fill.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

TEST(CudaBackendTest, FillsDeviceMemoryAndCopiesItBack) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto backend = GetBackend(Device::Cuda(0));
  ASSERT_TRUE(backend.ok()) << backend.status();
  constexpr size_t kCount = 1000;
  auto device = (*backend)->Allocate(kCount * sizeof(float), MemoryKind::kDevice);
  auto host = (*backend)->Allocate(kCount * sizeof(float), MemoryKind::kPinnedHost);
  auto stream = (*backend)->CreateStream();
  ASSERT_TRUE(device.ok() && host.ok() && stream.ok());
  // The stream's handle is not exposed: fill on the default stream and wait for the device.
  ASSERT_EQ(cuda::LaunchFillF32(static_cast<float*>(device->data()), kCount, 2.5f, nullptr), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE((*backend)->Copy(*device, 0, *host, 0, kCount * sizeof(float), **stream).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  const float* values = static_cast<const float*>(host->data());
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(values[i], 2.5f) << i;
}

}  // namespace
}  // namespace estuary
