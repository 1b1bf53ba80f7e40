// The engine-side rules of device_step.h that need no GPU: how --gpu-memory-utilization turns
// the device's free and total memory into a KV pool size, where it is accepted, and which river
// the GPU step refuses.
#include "core/model/device_step.h"

#include <cstdint>
#include <memory>
#include <string>

#include "core/model/model_loader.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(KvBytesForUtilizationTest, TheShareLeftAfterTheWeightsLessAWorkspace) {
  // 80 GiB device, 16 GiB in use (weights): 0.9 x 80 = 72, 56 left, 1 GiB workspace.
  absl::StatusOr<int64_t> kv = KvBytesForUtilization(0.9, 64 * kGiB, 80 * kGiB);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(*kv, static_cast<int64_t>(0.9 * 80 * kGiB) - 16 * kGiB - kGiB);
  // A small device: the workspace is an eighth of what is left.
  kv = KvBytesForUtilization(0.5, 7 * kGiB, 8 * kGiB);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(*kv, 3 * kGiB - 3 * kGiB / 8);
}

TEST(KvBytesForUtilizationTest, NoRoomOrABadShareIsAClearError) {
  absl::StatusOr<int64_t> kv = KvBytesForUtilization(0.2, 60 * kGiB, 80 * kGiB);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(kv.status().message().find("20480 MiB"), absl::string_view::npos) << kv.status();
  EXPECT_EQ(KvBytesForUtilization(1.5, kGiB, 2 * kGiB).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBytesForUtilization(0, kGiB, 2 * kGiB).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateDeviceSettingsTest, GpuMemoryUtilizationOnlyWithACudaDevice) {
  EXPECT_TRUE(ValidateDeviceSettings(-1, 64).ok());
  EXPECT_TRUE(ValidateDeviceSettings(0, 64, 0.9).ok());
  const absl::Status cpu = ValidateDeviceSettings(-1, 64, 0.9);
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cpu.message().find("--kv-cache-memory"), absl::string_view::npos);
  EXPECT_EQ(ValidateDeviceSettings(0, 64, 1.2).code(), absl::StatusCode::kInvalidArgument);
}

// The GPU step reads the backbone's LM head for every token: a river with its own int4 head is
// refused, naming the flag, before any device is looked for (so also in a build without CUDA).
TEST(CreateDeviceStepForTest, RefusesARiverWithItsOwnLmHead) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto river = River::Build(loaded->model->weights(), Int4QuantOptions(), /*first_layer=*/0,
                            /*row_parallel_blocks=*/1, RiverLmHead::kInt4);
  ASSERT_TRUE(river.ok()) << river.status();
  const std::unique_ptr<ShardedModel> model = ShardedModel::Borrow(*loaded->model, river->get());
  DeviceStepOptions options;
  options.device = 0;
  const auto step = CreateDeviceStepFor(*model, options, "decode");
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(step.status().message()).find("--river-lm-head shared"),
            std::string::npos)
      << step.status();
}

}  // namespace
}  // namespace estuary
