#include "process/ready_file.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace estuary::process {

absl::Status WriteReadyFile(const std::string& path, const std::string& address) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << address << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", temporary));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace estuary::process
