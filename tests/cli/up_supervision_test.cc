// `estuary up` supervises its workers as a kubelet would: SIGKILL one of two decode workers and
// the cluster keeps serving (requests succeed throughout), `estuary up` stays up, logs the exit
// and restarts the worker (a new process, registered again); only the router's death ends it.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/common/child_process.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {
namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::TempPath;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The pids of `parent`'s children whose command line names `binary` (any of its threads may
// have started them).
std::set<pid_t> ChildrenRunning(pid_t parent, const std::string& binary) {
  std::set<pid_t> found;
  std::error_code error;
  for (const auto& task : fs::directory_iterator(absl::StrCat("/proc/", parent, "/task"), error)) {
    for (absl::string_view pid : absl::StrSplit(ReadFile(task.path() / "children"), ' ',
                                                absl::SkipWhitespace())) {
      std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
      std::string state = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
      const bool zombie = state.find(") Z") != std::string::npos;
      if (!zombie && cmdline.find(binary) != std::string::npos) found.insert(std::stoi(std::string(pid)));
    }
  }
  return found;
}

bool Serves(estuary::v1::Inference::Stub& stub) {
  const testing::Generated out = testing::Generate(stub, testing::GreedyIds({1, 403, 407}, 8));
  return out.status.ok() && out.ids.size() == 8;
}

TEST(UpSupervisionTest, AKilledWorkerIsRestartedWhileTheOthersKeepServing) {
  const std::string logs = TempPath("up-supervision-logs");
  const std::string ready = TempPath("up-supervision.ready");
  fs::remove_all(logs);
  fs::remove(ready);
  absl::StatusOr<std::unique_ptr<ChildProcess>> up = ChildProcess::Start(
      {BinaryPath("cli/estuary"), "up", "--model", "models/stories260K", "--port", "0",
       "--prefill", "1", "--decode", "2", "--ready-file", ready, "--log-dir", logs,
       "--shutdown-timeout", "2s"},
      TempPath("up-supervision.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<std::string> router = WaitForReadyFile(ready, **up, absl::Seconds(120));
  ASSERT_TRUE(router.ok()) << router.status() << "\n" << (*up)->Log();
  auto stub = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(*router, grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(Serves(*stub));
  // Without --cluster-token, up drew a random one: a worker's port refuses a call without it.
  {
    std::smatch match;
    const std::string log = ReadFile(fs::path(logs) / "decode0.log");
    ASSERT_TRUE(std::regex_search(log, match, std::regex("worker serving on ([0-9.:]+),"))) << log;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    estuary::v1::WorkerInfo info;
    const grpc::Status status =
        estuary::v1::DecodeWorker::NewStub(
            grpc::CreateChannel(match[1].str(), grpc::InsecureChannelCredentials()))
            ->GetInfo(&context, {}, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  }

  const std::set<pid_t> before = ChildrenRunning((*up)->pid(), "estuary-decode");
  ASSERT_EQ(before.size(), 2u) << (*up)->Log();
  const pid_t victim = *before.begin();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  // Served throughout, and the worker comes back as a new process.
  int served = 0;
  std::set<pid_t> after;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    ASSERT_TRUE(Serves(*stub)) << "request " << served << " after the kill\n" << (*up)->Log();
    ++served;
    if ((*up)->Log().find("restarted (pid") != std::string::npos && served >= 10) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  after = ChildrenRunning((*up)->pid(), "estuary-decode");
  EXPECT_EQ(after.size(), 2u) << (*up)->Log();
  EXPECT_EQ(after.count(victim), 0u);
  EXPECT_FALSE((*up)->Wait(absl::ZeroDuration()).ok()) << "estuary up stopped\n" << (*up)->Log();
  const std::string log = (*up)->Log();
  EXPECT_NE(log.find("exited (code -9); restarting it in 1s"), std::string::npos) << log;
  EXPECT_NE(log.find("restarted (pid"), std::string::npos) << log;

  // Only the router's death stops the cluster, with a non-zero exit.
  const std::set<pid_t> routers = ChildrenRunning((*up)->pid(), "estuary-router");
  ASSERT_EQ(routers.size(), 1u);
  ASSERT_EQ(::kill(*routers.begin(), SIGKILL), 0);
  absl::StatusOr<int> exited = (*up)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exited.ok()) << "estuary up kept running without its router";
  EXPECT_NE(*exited, 0);
  EXPECT_TRUE(ChildrenRunning((*up)->pid(), "estuary-").empty());
}

}  // namespace
}  // namespace estuary
