#pragma once
// Logging facade. Everything in Estuary logs through these macros so the sink can change in one
// place. Lines go to stderr as "<level> <time> <file>:<line>] message".
//
//   ESTUARY_LOG(INFO) << "loaded " << n << " tensors";
//   ESTUARY_VLOG(1) << "hot-path detail";   // printed when ESTUARY_VERBOSITY >= 1 at start-up

#include <sstream>
#include <string_view>

namespace estuary::logging {

enum class Level { kInfo, kWarning, kError };

// Verbosity for ESTUARY_VLOG; set once by a binary's main before threads start.
void SetVerbosity(int level);
int Verbosity();

// One log line; writes itself when destroyed. Thread-safe: each line is written with one call.
class LogMessage {
 public:
  LogMessage(Level level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  Level level_;
  std::ostringstream stream_;
};

}  // namespace estuary::logging

#define ESTUARY_LOG_LEVEL_INFO ::estuary::logging::Level::kInfo
#define ESTUARY_LOG_LEVEL_WARNING ::estuary::logging::Level::kWarning
#define ESTUARY_LOG_LEVEL_ERROR ::estuary::logging::Level::kError

#define ESTUARY_LOG(level) \
  ::estuary::logging::LogMessage(ESTUARY_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define ESTUARY_VLOG(n)                              \
  if (::estuary::logging::Verbosity() < (n)) {       \
  } else                                             \
    ESTUARY_LOG(INFO)
