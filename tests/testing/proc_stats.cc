#include "tests/testing/proc_stats.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace estuary::testing {

absl::StatusOr<ProcStats> ReadProcStats(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid);
  std::ifstream status(dir + "/status");
  std::ifstream stat(dir + "/stat");
  if (!status || !stat) return absl::NotFoundError(absl::StrCat("no process ", pid));
  ProcStats out;
  for (std::string line; std::getline(status, line);) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "VmRSS:") fields >> out.rss_kib;
    if (key == "RssAnon:") fields >> out.rss_anon_kib;
    if (key == "RssFile:") fields >> out.rss_file_kib;
    if (key == "Threads:") fields >> out.threads;
  }
  // stat: "pid (comm) state ..." with utime and stime the 14th and 15th fields; comm may hold
  // spaces, so count from the last ')'.
  std::string line;
  std::getline(stat, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  out.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++out.fds;
  }
  return out;
}

}  // namespace estuary::testing
