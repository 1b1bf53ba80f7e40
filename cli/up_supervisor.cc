#include "cli/up_supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"

namespace estuary::cli {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(200);
constexpr absl::Duration kHealthyRun = absl::Minutes(1);  // a run this long resets the back-off
constexpr absl::Duration kRestartTimeout = absl::Seconds(120);

// Sleeps up to `wait`, returning early (false) when the cluster is stopping.
bool SleepUnlessStopping(absl::Duration wait, const std::atomic<bool>& stopping) {
  const absl::Time until = absl::Now() + wait;
  while (absl::Now() < until) {
    if (stopping.load()) return false;
    absl::SleepFor(std::min(kPoll, until - absl::Now()));
  }
  return !stopping.load();
}

}  // namespace

absl::Duration RestartBackoff(int restarts) {
  const int doublings = std::clamp(restarts - 1, 0, 5);
  return std::min(absl::Seconds(1) * (1 << doublings), absl::Seconds(30));
}

absl::StatusOr<UpMember> LaunchMember(const std::string& name, const std::string& binary,
                                      std::vector<std::string> flags,
                                      const std::filesystem::path& log_dir,
                                      absl::Duration timeout) {
  ESTUARY_ASSIGN_OR_RETURN(ServingProcess serving,
                           StartServing(binary, flags, (log_dir / name).string(), timeout));
  UpMember member;
  member.name = name;
  member.binary = binary;
  member.flags = std::move(flags);
  member.process = std::move(serving.process);
  member.address = serving.address;
  member.started = absl::Now();
  return member;
}

void SuperviseMembers(std::vector<UpMember>& members, const std::filesystem::path& log_dir,
                      const std::atomic<bool>& stopping, std::atomic<bool>& router_died) {
  while (!stopping.load()) {
    for (size_t i = 0; i < members.size() && !stopping.load(); ++i) {
      UpMember& m = members[i];
      absl::StatusOr<int> exited = m.process->Wait(absl::ZeroDuration());
      if (!exited.ok()) continue;  // still running
      const std::string log = (log_dir / (m.name + ".log")).string();
      if (i == 0) {
        ESTUARY_LOG(ERROR) << "the router exited (code " << *exited << "): stopping the cluster; "
                           << "its log: " << log << "\n" << m.process->Log();
        router_died = true;
        ::kill(::getpid(), SIGTERM);
        return;
      }
      if (absl::Now() - m.started >= kHealthyRun) m.restarts = 0;
      ++m.restarts;
      const absl::Duration backoff = RestartBackoff(m.restarts);
      ESTUARY_LOG(WARNING) << m.name << " exited (code " << *exited << "); restarting it in "
                           << absl::FormatDuration(backoff) << " (restart " << m.restarts
                           << "); its log: " << log;
      std::error_code ignored;
      std::filesystem::rename(log, absl::StrCat(log, ".", m.restarts - 1), ignored);
      if (!SleepUnlessStopping(backoff, stopping)) return;
      absl::StatusOr<UpMember> again =
          LaunchMember(m.name, m.binary, m.flags, log_dir, kRestartTimeout);
      if (!again.ok()) {
        // Counted as another exit: the next round backs off longer and tries again.
        ESTUARY_LOG(ERROR) << m.name << " did not come back: " << again.status();
        m.started = absl::Now();
        continue;
      }
      again->restarts = m.restarts;
      m = std::move(*again);
      ESTUARY_LOG(INFO) << m.name << " restarted (pid " << m.process->pid() << ", "
                        << m.address << ")";
    }
    absl::SleepFor(kPoll);
  }
}

}  // namespace estuary::cli
