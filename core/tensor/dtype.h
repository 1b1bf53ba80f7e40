#pragma once
// Element types of tensors and their storage sizes.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace estuary {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kInt4,  // packed two per byte, low nibble first; scales and zero points live beside it
};

const char* DTypeName(DType dtype);
// Parses "f32", "bf16", "f16", "int4" (as used by --dtype).
std::optional<DType> ParseDType(std::string_view name);

// Bytes needed for `numel` elements (int4 rounds up to whole bytes).
constexpr size_t DTypeBytes(DType dtype, size_t numel) {
  switch (dtype) {
    case DType::kF32:
      return numel * 4;
    case DType::kBF16:
    case DType::kF16:
      return numel * 2;
    case DType::kInt4:
      return (numel + 1) / 2;
  }
  return 0;
}

}  // namespace estuary
