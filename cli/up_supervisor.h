#pragma once
// The processes of `estuary up` and their supervision, as a kubelet would do it: a worker that
// exits is started again with the flags it had, after a back-off that doubles from 1 s to 30 s
// (back to 1 s once a run has lasted a minute), each exit and restart logged with its log file;
// the other workers keep serving meanwhile. Only the router's exit ends the cluster (its
// clients' address would change). `estuary up` (up_command.cc) owns the members; the
// supervisor's thread is the only one that touches them until it is joined.

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/common/child_process.h"

namespace estuary::cli {

struct UpMember {
  std::string name;  // "router", "decode0", "prefill0", ...
  std::string binary;
  std::vector<std::string> flags;
  std::unique_ptr<ChildProcess> process;
  std::string address;
  int restarts = 0;
  absl::Time started;
};

// Starts `binary` with `flags`, its output in `<log_dir>/<log_name>.log`, and waits until it
// serves (at most `timeout`).
absl::StatusOr<UpMember> LaunchMember(const std::string& name, const std::string& binary,
                                      std::vector<std::string> flags,
                                      const std::filesystem::path& log_dir,
                                      absl::Duration timeout);

// Watches `members` (members[0] is the router) until `stopping` is set, restarting workers that
// exit. When the router exits it sets `router_died` and sends this process SIGTERM (so that
// `estuary up` stops the rest) and returns.
void SuperviseMembers(std::vector<UpMember>& members, const std::filesystem::path& log_dir,
                      const std::atomic<bool>& stopping, std::atomic<bool>& router_died);

// The back-off before restart number `restarts` (1 s, 2 s, 4 s, ... 30 s at most).
absl::Duration RestartBackoff(int restarts);

}  // namespace estuary::cli
