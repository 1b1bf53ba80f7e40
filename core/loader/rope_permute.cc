#include "core/loader/rope_permute.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace estuary {
namespace {

absl::StatusOr<Tensor> PermuteRows(const Tensor& w, int head_dim, bool to_halves) {
  if (w.rank() != 2 || w.dtype() == DType::kInt4 || !w.device().is_cpu() || head_dim <= 0 ||
      head_dim % 2 != 0 || w.dim(0) % head_dim != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot permute the RoPE rows of ",
                                                   w.DebugString(), " with head_dim ", head_dim));
  }
  ESTUARY_ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(w.dtype(), w.shape()));
  const size_t row_bytes = DTypeBytes(w.dtype(), static_cast<size_t>(w.dim(1)));
  const auto* src = static_cast<const uint8_t*>(w.raw());
  auto* dst = static_cast<uint8_t*>(out.mutable_raw());
  const int64_t half = head_dim / 2;
  for (int64_t head = 0; head < w.dim(0) / head_dim; ++head) {
    const int64_t base = head * head_dim;
    for (int64_t j = 0; j < half; ++j) {
      for (int64_t parity = 0; parity < 2; ++parity) {
        const int64_t interleaved = base + 2 * j + parity;
        const int64_t halves = base + parity * half + j;
        const int64_t from = to_halves ? interleaved : halves;
        const int64_t to = to_halves ? halves : interleaved;
        std::memcpy(dst + to * row_bytes, src + from * row_bytes, row_bytes);
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Tensor> InterleavedToHalvesRows(const Tensor& w, int head_dim) {
  return PermuteRows(w, head_dim, /*to_halves=*/true);
}

absl::StatusOr<Tensor> HalvesToInterleavedRows(const Tensor& w, int head_dim) {
  return PermuteRows(w, head_dim, /*to_halves=*/false);
}

}  // namespace estuary
