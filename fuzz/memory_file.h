#pragma once
// MemoryFile: fuzz input as a file the loaders open by path (an anonymous memfd, named
// /proc/self/fd/N), so that a target drives the production entry points (LoadLlama2cCheckpoint,
// ReadLlama2cVocab: open, map, read) without a disk write per input.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace estuary::fuzz {

class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(memfd_create("estuary-fuzz", 0)) {
    if (fd_ < 0) __builtin_trap();  // the machine cannot run this target
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) __builtin_trap();
      done += static_cast<size_t>(n);
    }
  }
  ~MemoryFile() { close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  const int fd_;
};

}  // namespace estuary::fuzz
