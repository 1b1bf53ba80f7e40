// A stuck tensor-parallel rank (reliability C8): a decode worker at TP 2 whose rank 1 stops
// making progress at its first step (the test hook --debug-stall-rank 1). Its step never
// returns, so the worker turns not ready at --engine-stall-timeout (the router then has no ready
// decode worker and says so), and its watchdog ends the process with status 3 at
// --engine-watchdog-timeout, so that a supervisor restarts it; the stream that was running on it
// ends with a typed status instead of hanging. Figures are printed ("[figure]").

#include <cstdio>
#include <thread>

#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/health_check.h"

namespace estuary {
namespace {

namespace t = ::estuary::testing;

TEST(StuckRankTest, AStuckRankMakesTheWorkerNotReadyThenExitNonZero) {
  constexpr absl::Duration kStall = absl::Seconds(1), kWatchdog = absl::Seconds(3);
  t::ClusterSpec spec = t::Spec("stories260K", 0, 1, 1, 2);
  spec.decode_flags = {"--debug-stall-rank", "1",
                       "--engine-stall-timeout", absl::FormatDuration(kStall),
                       "--engine-watchdog-timeout", absl::FormatDuration(kWatchdog)};
  t::Cluster cluster(spec);
  ServingProcess& decode = cluster.decode(0);
  ASSERT_TRUE(t::WaitForHealth(decode.address, "", t::kServing, absl::Seconds(10)).ok());
  ASSERT_TRUE(t::WaitForHealth(cluster.router_address(), "", t::kServing, absl::Seconds(10)).ok());

  // The first request's first step stalls rank 1 for good.
  const t::GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  t::Generated stream;
  const absl::Time start = absl::Now();
  std::thread client([&] {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stream = t::Generate(cluster.stub(), cluster.Greedy(c.prompt_ids, 8), &context);
  });

  auto not_ready = t::WaitForHealth(decode.address, "", t::kNotServing, absl::Seconds(10));
  ASSERT_TRUE(not_ready.ok()) << not_ready.status() << cluster.Logs();
  const absl::Duration worker_not_ready = absl::Now() - start;
  auto router_not_ready =
      t::WaitForHealth(cluster.router_address(), "", t::kNotServing, absl::Seconds(10));
  const absl::Duration router_lag = absl::Now() - start - worker_not_ready;
  absl::StatusOr<int> exit_code = decode.process->Wait(absl::Seconds(15));
  const absl::Duration exited = absl::Now() - start;
  client.join();
  const absl::Duration stream_ended = absl::Now() - start;

  std::printf("[figure] C8 stuck rank (stall timeout %s, watchdog %s): worker not ready after "
              "%.2f s, router not ready %.2f s later, worker exited with %d after %.2f s, the "
              "stream ended %s after %.2f s\n",
              absl::FormatDuration(kStall).c_str(), absl::FormatDuration(kWatchdog).c_str(),
              absl::ToDoubleSeconds(worker_not_ready), absl::ToDoubleSeconds(router_lag),
              exit_code.ok() ? *exit_code : -1000, absl::ToDoubleSeconds(exited),
              stream.status.ok() ? "OK" : std::to_string(stream.status.error_code()).c_str(),
              absl::ToDoubleSeconds(stream_ended));
  // Not ready once the step outlived the stall timeout (checked every 100 ms), exit at the
  // watchdog: with a loaded machine's slack on the late side.
  EXPECT_GE(worker_not_ready, kStall);
  EXPECT_LE(worker_not_ready, kStall + absl::Seconds(2));
  EXPECT_TRUE(router_not_ready.ok()) << router_not_ready.status();
  EXPECT_LE(router_lag, absl::Seconds(2));  // a heartbeat (500 ms) carries not_ready
  ASSERT_TRUE(exit_code.ok()) << "the stuck worker did not exit: " << exit_code.status();
  EXPECT_EQ(*exit_code, 3) << cluster.Logs();
  EXPECT_GE(exited, kWatchdog);
  EXPECT_LE(exited, kWatchdog + absl::Seconds(3));
  EXPECT_NE(decode.process->Log().find("watchdog"), std::string::npos);
  // The stream ends, typed, once its worker is gone (not at the client's 30 s deadline).
  EXPECT_FALSE(stream.status.ok());
  EXPECT_NE(stream.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LE(stream_ended, exited + absl::Seconds(5));
}

}  // namespace
}  // namespace estuary
