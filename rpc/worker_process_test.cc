// Worker flag validation: devices and KV transports go together.
#include "rpc/worker_process.h"

#include "gtest/gtest.h"

namespace estuary::rpc {
namespace {

WorkerProcessOptions Options(const std::string& device, const std::string& kv_transport) {
  WorkerProcessOptions options;
  options.model = "../shared/models/stories260K";
  options.device = device;
  options.kv_transport = kv_transport;
  return options;
}

TEST(WorkerProcessOptionsTest, DeviceAndKvTransportGoTogether) {
  EXPECT_TRUE(ValidateWorkerProcessOptions(Options("cpu", "ucx")).ok());
  EXPECT_TRUE(ValidateWorkerProcessOptions(Options("cuda", "nccl")).ok());
  EXPECT_TRUE(ValidateWorkerProcessOptions(Options("cuda:1", "nccl")).ok());
  for (auto [device, transport] : {std::pair{"cpu", "nccl"},
                                   {"cuda", "ucx"},
                                   {"gpu", "ucx"},
                                   {"cpu", "tcp"},
                                   {"cuda:", "nccl"}}) {
    const absl::Status status = ValidateWorkerProcessOptions(Options(device, transport));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << device << " " << transport;
  }
  EXPECT_EQ(WorkerDevice(Options("cuda:2", "nccl"))->ordinal, 2);
}

}  // namespace
}  // namespace estuary::rpc
