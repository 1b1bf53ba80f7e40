// Embedding lookup: copies (and widens) one table row per token id.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cpu/widen.h"

namespace estuary::kernels::cpu {

absl::Status Embedding(const Tensor& table, absl::Span<const int32_t> ids, float* out) {
  if (!table.defined() || table.rank() != 2 || !internal::IsFloatWeight(table.dtype()) ||
      !table.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Embedding needs a rank-2 f32/bf16/f16 host table, got ",
                     table.defined() ? table.DebugString() : std::string("an empty tensor")));
  }
  const int64_t vocab = table.dim(0), dim = table.dim(1);
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", ids[t], " at index ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const auto* base = static_cast<const uint8_t*>(table.raw());
  const size_t row_bytes = DTypeBytes(table.dtype(), static_cast<size_t>(dim));
  for (size_t t = 0; t < ids.size(); ++t) {
    internal::WidenToF32(table.dtype(), base + static_cast<size_t>(ids[t]) * row_bytes, dim,
                         out + static_cast<int64_t>(t) * dim);
  }
  return absl::OkStatus();
}

}  // namespace estuary::kernels::cpu
