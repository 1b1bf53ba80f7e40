#include "core/common/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace estuary {
namespace {

// Fills `out` from getrandom(2) (it blocks only until the kernel's pool is seeded, at boot),
// else from /dev/urandom. False when neither answers (a sandbox without either).
bool KernelRandom(uint8_t* out, size_t n) {
  size_t filled = 0;
  while (filled < n) {
    const ssize_t got = ::getrandom(out + filled, n - filled, 0);
    if (got > 0) {
      filled += static_cast<size_t>(got);
    } else if (got < 0 && errno != EINTR && errno != EAGAIN) {
      std::ifstream urandom("/dev/urandom", std::ios::binary);
      return static_cast<bool>(
          urandom.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n)));
    }
  }
  return true;
}

}  // namespace

std::string SecureRandomHex(size_t bytes) {
  std::vector<uint8_t> buffer(bytes);
  if (!KernelRandom(buffer.data(), bytes)) {
    // libstdc++'s random_device reads the same kernel sources or the CPU's RDRAND/RDSEED.
    std::random_device device;
    for (uint8_t& b : buffer) b = static_cast<uint8_t>(device());
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(buffer.data()), buffer.size()));
}

}  // namespace estuary
