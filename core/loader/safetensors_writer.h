#pragma once
// SafetensorsStreamWriter: writes a safetensors file whose tensor list is known up front but
// whose data arrives piece by piece, so that multi-gigabyte files (estuary synth, convert) never
// sit in memory. WriteSafetensors (safetensors.h) is built on it.

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor/tensor.h"

namespace estuary {

struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kF32;  // f32, bf16 or f16
  Shape shape;
};

class SafetensorsStreamWriter {
 public:
  // Creates `path`.tmp and writes the header (tensors in `specs` order, data contiguous, header
  // padded with spaces to a multiple of 8 bytes).
  static absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> Create(
      const std::string& path, const std::vector<SafetensorsTensorSpec>& specs,
      const std::map<std::string, std::string>& metadata);

  // Removes the temporary file unless Finish() succeeded.
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // Appends the next bytes of the data: the tensors' raw bytes, in spec order, back to back.
  absl::Status Append(absl::Span<const uint8_t> bytes);
  // Appends a whole host tensor; its dtype and shape must match the next spec. Use either
  // Append or AppendTensor for a file, not both.
  absl::Status AppendTensor(const Tensor& tensor);
  // Checks that exactly all the data was appended, then renames the file into place.
  absl::Status Finish();

  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t bytes_written() const { return written_; }

 private:
  SafetensorsStreamWriter() = default;

  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;
  std::vector<SafetensorsTensorSpec> specs_;
  std::vector<uint64_t> ends_;  // end offset of each spec's data
  size_t next_tensor_ = 0;      // for AppendTensor
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
  bool finished_ = false;
};

}  // namespace estuary
