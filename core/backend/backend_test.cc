#include "core/backend/backend.h"

#include <cstdint>
#include <cstring>
#include <vector>

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
  EXPECT_EQ((*backend)->Allocate(8, MemoryKind::kMappedFile).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Weights and KV blocks are streamed every step: blocks of 1 MiB and more start on a 2 MiB
// boundary (where a transparent huge page can back them), smaller ones on a cache line.
TEST(BufferTest, LargeHostBlocksAreHugePageAlignedAndZeroed) {
  const size_t large = (size_t{3} << 20) + 5;
  Buffer big = Buffer::AllocateHost(large);
  ASSERT_FALSE(big.empty());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % (uintptr_t{2} << 20), 0u);
  const auto* bytes = static_cast<const uint8_t*>(big.data());
  EXPECT_EQ(bytes[0], 0);
  EXPECT_EQ(bytes[large - 1], 0);
  Buffer small = Buffer::AllocateHost(100);
  ASSERT_FALSE(small.empty());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  EXPECT_EQ(static_cast<const uint8_t*>(small.data())[99], 0);
}

// The loader's copies of mapped weights: the same bytes in the same kind of block.
TEST(BufferTest, CopyToHostCopiesIntoHugePageAlignedBlocks) {
  std::vector<uint8_t> source((size_t{2} << 20) + 3);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 31 + 7);
  Buffer copy = Buffer::CopyToHost(source.data(), source.size());
  ASSERT_FALSE(copy.empty());
  EXPECT_EQ(copy.size(), source.size());
  EXPECT_EQ(copy.memory_kind(), MemoryKind::kHost);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data()) % (uintptr_t{2} << 20), 0u);
  EXPECT_EQ(std::memcmp(copy.data(), source.data(), source.size()), 0);
  Buffer empty_copy = Buffer::CopyToHost(source.data(), 0);
  EXPECT_FALSE(empty_copy.empty());
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
