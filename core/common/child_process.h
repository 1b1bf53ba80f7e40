#pragma once
// ChildProcess: a long-running program started by another (a worker started by `estuary up` or
// by a test), with its output going to a log file. The destructor kills it (SIGKILL) and reaps
// it, so nothing is left behind when the parent fails. Not thread-safe.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace estuary {

class ChildProcess {
 public:
  // Starts argv[0] with `argv`; stdout and stderr go to `log_path`.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `signal` (nothing once reaped).
  void Signal(int signal);
  // Waits for the exit; the exit code, or -signal when killed. DEADLINE_EXCEEDED at `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // The log so far.
  std::string Log() const;

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  bool reaped_ = false;
  int exit_code_ = 0;
  std::string log_path_;
};

// Waits until `path` exists and holds a full line; returns that line. DEADLINE_EXCEEDED at
// `timeout`, or earlier if `child` exits first (FAILED_PRECONDITION with its log).
absl::StatusOr<std::string> WaitForReadyFile(const std::string& path, ChildProcess& child,
                                             absl::Duration timeout);

// A server that says where it listens through `--ready-file` (the Estuary binaries do).
struct ServingProcess {
  std::unique_ptr<ChildProcess> process;
  std::string address;  // the ready file's line
};
// Starts `binary --ready-file <prefix>.ready <flags...>` with its output in `<prefix>.log` (a
// stale ready file is removed first) and waits until it is ready (WaitForReadyFile).
// `launcher`, when given, goes before the binary (e.g. `ip netns exec NS`, which execs the
// binary, so the child's pid stays the binary's own).
absl::StatusOr<ServingProcess> StartServing(const std::string& binary,
                                            const std::vector<std::string>& flags,
                                            const std::string& prefix, absl::Duration timeout,
                                            const std::vector<std::string>& launcher = {});

}  // namespace estuary
