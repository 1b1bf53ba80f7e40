#pragma once
// Read-only memory-mapped file. Owns the mapping; move-only. Used by the loaders so that weights
// are paged in on demand instead of copied.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace estuary {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to an empty view. Errors name the path.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const {
    return std::string_view(reinterpret_cast<const char*>(data_), size_);
  }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Reads a whole (small) file into a string, refusing files larger than `max_bytes`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes);

// Writes `contents` to `path` atomically (temporary file + rename).
absl::Status WriteStringToFile(const std::string& path, std::string_view contents);

}  // namespace estuary
