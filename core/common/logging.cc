#include "core/common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstring>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace estuary::logging {
namespace {
std::atomic<int> g_verbosity{0};

const char* LevelLetter(Level level) {
  switch (level) {
    case Level::kInfo:
      return "I";
    case Level::kWarning:
      return "W";
    case Level::kError:
      return "E";
  }
  return "?";
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void SetVerbosity(int level) { g_verbosity.store(level, std::memory_order_relaxed); }
int Verbosity() { return g_verbosity.load(std::memory_order_relaxed); }

LogMessage::LogMessage(Level level, const char* file, int line) : level_(level) {
  stream_ << LevelLetter(level_) << ' '
          << absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()) << ' '
          << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
}

}  // namespace estuary::logging
