// Worker flag validation: devices and KV transports go together.
#include "worker/worker_process.h"

#include "gtest/gtest.h"

namespace estuary::worker {
namespace {

WorkerProcessOptions Options(const std::string& device, const std::string& kv_transport) {
  WorkerProcessOptions options;
  options.model = "models/stories260K";
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

TEST(EngineHealthTest, StallsAndRepeatedFailures) {
  WorkerProcessOptions options;
  options.engine_stall_timeout = absl::Seconds(2);
  options.max_failed_steps = 3;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  bool failed = false;
  StepLoopProgress progress;
  EXPECT_FALSE(EngineHealthy(progress, options, &failed, t0));  // the loop has not started
  progress.running = true;
  EXPECT_TRUE(EngineHealthy(progress, options, &failed, t0));
  progress.in_step = true;
  progress.step_started = t0;
  EXPECT_TRUE(EngineHealthy(progress, options, &failed, t0 + absl::Seconds(1)));
  EXPECT_FALSE(EngineHealthy(progress, options, &failed, t0 + absl::Seconds(3)));  // stalled
  progress.in_step = false;
  EXPECT_TRUE(EngineHealthy(progress, options, &failed, t0 + absl::Seconds(3)));  // it ended
  progress.consecutive_failures = 2;
  EXPECT_TRUE(EngineHealthy(progress, options, &failed, t0 + absl::Seconds(4)));
  progress.consecutive_failures = 3;
  EXPECT_FALSE(EngineHealthy(progress, options, &failed, t0 + absl::Seconds(4)));
  progress.consecutive_failures = 0;  // a later step succeeded: still out until restarted
  EXPECT_FALSE(EngineHealthy(progress, options, &failed, t0 + absl::Seconds(5)));
  EXPECT_TRUE(failed);
}

TEST(EngineHealthTest, TheWatchdogFiresOnAStepPastItsTimeoutOnly) {
  WorkerProcessOptions options;
  options.engine_stall_timeout = absl::Seconds(2);
  options.engine_watchdog_timeout = absl::Seconds(5);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  StepLoopProgress progress;
  progress.running = true;
  EXPECT_FALSE(EngineStuck(progress, options, t0 + absl::Hours(1)));  // idle: no step runs
  progress.in_step = true;
  progress.step_started = t0;
  EXPECT_FALSE(EngineStuck(progress, options, t0 + absl::Seconds(3)));  // stalled, not stuck
  EXPECT_TRUE(EngineStuck(progress, options, t0 + absl::Seconds(6)));
  options.engine_watchdog_timeout = absl::ZeroDuration();  // off
  EXPECT_FALSE(EngineStuck(progress, options, t0 + absl::Hours(1)));
}

TEST(WorkerProcessOptionsTest, DrainAndHealthFlagsAreChecked) {
  WorkerProcessOptions options = Options("cpu", "ucx");
  options.shutdown_timeout = absl::Seconds(-1);
  EXPECT_EQ(ValidateWorkerProcessOptions(options).code(), absl::StatusCode::kInvalidArgument);
  options = Options("cpu", "ucx");
  options.engine_stall_timeout = absl::ZeroDuration();
  EXPECT_EQ(ValidateWorkerProcessOptions(options).code(), absl::StatusCode::kInvalidArgument);
  options = Options("cpu", "ucx");
  options.max_failed_steps = 0;
  EXPECT_EQ(ValidateWorkerProcessOptions(options).code(), absl::StatusCode::kInvalidArgument);
  options = Options("cpu", "ucx");
  options.engine_watchdog_timeout = absl::Seconds(10);  // below --engine-stall-timeout (60 s)
  absl::Status watchdog = ValidateWorkerProcessOptions(options);
  EXPECT_EQ(watchdog.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(watchdog.message().find("--engine-watchdog-timeout"), std::string::npos) << watchdog;
  options.engine_watchdog_timeout = absl::ZeroDuration();  // off
  EXPECT_TRUE(ValidateWorkerProcessOptions(options).ok());
  options = Options("cpu", "ucx");
  options.debug_stall_rank = 1;  // TP 1 has rank 0 only
  EXPECT_EQ(ValidateWorkerProcessOptions(options).code(), absl::StatusCode::kInvalidArgument);
  options.tp_size = 2;
  EXPECT_TRUE(ValidateWorkerProcessOptions(options).ok());
  options = Options("cpu", "ucx");
  options.advertise_address = "198.51.100.7";  // TEST-NET-2: not an address of this machine
  const absl::Status status = ValidateWorkerProcessOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--advertise-address"), std::string::npos) << status;
}

}  // namespace
}  // namespace estuary::worker
