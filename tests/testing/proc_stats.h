#pragma once
// What /proc says about a process, for tests that watch a server's resources over a run
// (tests/reliability: the soak's RSS, threads and fds; the router's CPU time per token).

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace estuary::testing {

struct ProcStats {
  int64_t rss_kib = 0;       // /proc/PID/status VmRSS = RssAnon + RssFile + RssShmem
  int64_t rss_anon_kib = 0;  // RssAnon: heap, stacks, anonymous mappings (where a leak shows)
  int64_t rss_file_kib = 0;  // RssFile: the binary's code and mapped files, touched on first use
  int threads = 0;           // /proc/PID/status Threads
  int fds = 0;               // entries of /proc/PID/fd
  double cpu_seconds = 0.0;  // /proc/PID/stat utime + stime
};

// NOT_FOUND when the process is gone.
absl::StatusOr<ProcStats> ReadProcStats(pid_t pid);

}  // namespace estuary::testing
