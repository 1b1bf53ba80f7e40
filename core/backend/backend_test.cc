#include "core/backend/backend.h"

#include <cstring>

#include "gtest/gtest.h"

namespace estuary {
namespace {

TEST(CpuBackendTest, AllocatesCopiesAndChecksRanges) {
  auto backend = GetBackend(Device::Cpu());
  ASSERT_TRUE(backend.ok());
  auto a = (*backend)->Allocate(64, MemoryKind::kHost);
  auto b = (*backend)->Allocate(64, MemoryKind::kHost);
  ASSERT_TRUE(a.ok() && b.ok());
  std::memset(a->data(), 7, 64);
  auto stream = (*backend)->CreateStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*backend)->Copy(*a, 8, *b, 16, 32, **stream).ok());
  EXPECT_EQ(static_cast<uint8_t*>(b->data())[16], 7);
  EXPECT_EQ(static_cast<uint8_t*>(b->data())[15], 0);
  EXPECT_EQ((*backend)->Copy(*a, 40, *b, 0, 32, **stream).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*backend)->Allocate(8, MemoryKind::kDevice).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RegistryTest, CudaDeviceIsUnavailableOrUnimplementedWithoutGpu) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  auto backend = GetBackend(Device::Cuda(0));
  EXPECT_FALSE(backend.ok());
  EXPECT_TRUE(backend.status().code() == absl::StatusCode::kUnimplemented ||
              backend.status().code() == absl::StatusCode::kUnavailable)
      << backend.status();
}

TEST(ParseDeviceTest, AcceptsCpuCudaAndOrdinals) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::Cpu());
  EXPECT_EQ(*ParseDevice("cuda"), Device::Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:3"), Device::Cuda(3));
  for (const char* bad :
       {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "CPU", "cuda:99999"}) {
    EXPECT_EQ(ParseDevice(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace estuary
