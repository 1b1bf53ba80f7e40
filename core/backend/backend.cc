#include "core/backend/backend.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace estuary {

absl::Status CheckBufferRange(const Buffer& buffer, size_t offset, size_t bytes) {
  if (offset > buffer.size() || bytes > buffer.size() - offset) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", ", offset + bytes,
                                              ") outside a buffer of ", buffer.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  constexpr std::string_view kCuda = "cuda:";
  int ordinal = -1;
  if (text.substr(0, kCuda.size()) == kCuda &&
      absl::SimpleAtoi(absl::string_view(text.data() + kCuda.size(), text.size() - kCuda.size()),
                       &ordinal) &&
      ordinal >= 0 && ordinal < 1024) {
    return Device::Cuda(ordinal);
  }
  return absl::InvalidArgumentError(absl::StrCat("--device = '",
                                                 absl::string_view(text.data(), text.size()),
                                                 "': expected cpu, cuda or cuda:N"));
}

}  // namespace estuary
