#pragma once
// safetensors: parsing (strictly, as the reference reader does), zero-copy tensor views, and
// writing. Format: u64 little-endian header length N, N bytes of JSON, then the raw data.
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data start) and may hold "__metadata__" (string -> string).
//
// Every byte of a safetensors file is untrusted (reliability.md §1.10): the parser checks all
// offsets and sizes before anything reads tensor data, and is fuzzed
// (fuzz/safetensors_header_fuzzer.cc).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/common/mapped_file.h"
#include "core/tensor/tensor.h"

namespace estuary {

// Largest header accepted (the reference reader's limit, 100 MB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// Deepest JSON nesting accepted in a header (a valid one nests 3 deep).
inline constexpr int kSafetensorsMaxHeaderDepth = 8;
// Highest tensor rank accepted.
inline constexpr int kSafetensorsMaxRank = 8;

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as in the file: "F32", "BF16", "I64", ...
  bool loadable = false;   // F32, BF16 or F16; `dtype` is meaningful only when true
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data start
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in data order (sorted by `begin`)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length: where offset 0 of the data is in the file
};

// Parses and checks the header of a whole safetensors file held in `file_bytes`: header length
// and limit, first byte '{', JSON (UTF-8, nesting depth), each entry's dtype (known), shape
// (non-negative integers, rank <= 8, no overflow) and data_offsets (begin <= end, inside the
// data, end - begin == numel * dtype size), tensors contiguous and covering the data exactly,
// no duplicate names, __metadata__ string -> string. Tensors of dtypes Estuary cannot load
// (F64, I64, ...) parse; SafetensorsTensor reports them.
//
// Errors name `file_name` and the tensor or field: DATA_LOSS when the file is shorter than its
// header says (truncation), INVALID_ARGUMENT otherwise. Reads only `file_bytes`; never allocates
// more than a small multiple of the header's size.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::Span<const uint8_t> file_bytes,
                                                         absl::string_view file_name);

// The tensor `entry` of `file` (whose header is `header`) as an f32/bf16/f16 tensor. Zero-copy:
// the tensor views the mapping and keeps `file` alive; data that is not aligned to its element
// size is copied into an aligned buffer instead. UNIMPLEMENTED for other dtypes.
absl::StatusOr<Tensor> SafetensorsTensor(std::shared_ptr<const MappedFile> file,
                                         const SafetensorsHeader& header,
                                         const SafetensorsEntry& entry);

// Writes `tensors` (host f32/bf16/f16) to `path` in the given order, data contiguous, the
// header padded with spaces to a multiple of 8 bytes. Names must be unique and not
// "__metadata__". The file appears atomically (temporary file + rename).
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata);

// The safetensors name of an f32/bf16/f16 dtype ("F32", "BF16", "F16"); nullptr for others.
const char* SafetensorsDTypeName(DType dtype);

}  // namespace estuary
