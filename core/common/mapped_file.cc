#include "core/common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace estuary {
namespace {
absl::Status ErrnoError(const char* what, const std::string& path) {
  const int err = errno;
  const std::string reason = std::strerror(err);
  const std::string message = absl::StrCat(what, " ", path, ": ", reason);
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}
}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    absl::Status status = ErrnoError("cannot stat", path);
    ::close(fd);
    return status;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      absl::Status status = ErrnoError("cannot mmap", path);
      ::close(fd);
      return status;
    }
    data = static_cast<const uint8_t*>(mapped);
  }
  ::close(fd);  // The mapping stays valid after close.
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  auto file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  if ((*file)->size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": file is ", (*file)->size(),
                                                   " bytes, more than the limit of ", max_bytes));
  }
  return std::string((*file)->view());
}

absl::Status WriteStringToFile(const std::string& path, std::string_view contents) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return ErrnoError("cannot create", temp);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out) return ErrnoError("cannot write", temp);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path);
  return absl::OkStatus();
}

}  // namespace estuary
