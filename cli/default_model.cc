#include "cli/default_model.h"

#include <cstdlib>
#include <filesystem>

#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_writer.h"

namespace estuary::cli {
namespace fs = std::filesystem;

absl::StatusOr<std::string> ResolveModelPath(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("ESTUARY_MODEL"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  std::error_code ec;
  // The repository ships stories12L (ours; 12 layers, so the exit river has room to exit) and
  // stories260K (MIT licence, from llama2.c), in models/.
  for (const fs::path& candidate : {fs::path(ESTUARY_SOURCE_DIR) / "models/stories12L",
                                   fs::path(ESTUARY_SOURCE_DIR) / "models/stories260K"}) {
    if (fs::exists(candidate / "model.bin", ec)) return fs::weakly_canonical(candidate).string();
  }
  const char* home = std::getenv("XDG_CACHE_HOME");
  fs::path cache = home ? fs::path(home) : fs::temp_directory_path();
  const fs::path tiny = cache / "estuary" / "synth-tiny";
  if (!fs::exists(tiny / "config.json", ec)) {
    ESTUARY_LOG(INFO) << "no model given and none shipped: synthesizing a tiny one in " << tiny;
    ESTUARY_RETURN_IF_ERROR(SynthesizeModel("tiny", tiny.string(), /*seed=*/0));
  }
  return tiny.string();
}

}  // namespace estuary::cli
