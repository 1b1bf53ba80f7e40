#include "core/tensor/dtype.h"

namespace estuary {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kInt4:
      return "int4";
  }
  return "unknown";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "int4") return DType::kInt4;
  return std::nullopt;
}

}  // namespace estuary
