#include "core/model/llama_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/common/range_check.h"

namespace estuary {
absl::Status LlamaConfig::Validate() const {
  // Bounds generous enough for any released Llama, tight enough that products do not overflow.
  for (const absl::Status& s : {
           CheckRange("model config", "dim", dim, 1, 1 << 16),
           CheckRange("model config", "hidden_dim", hidden_dim, 1, 1 << 18),
           CheckRange("model config", "n_layers", n_layers, 1, 1024),
           CheckRange("model config", "n_heads", n_heads, 1, 1024),
           CheckRange("model config", "n_kv_heads", n_kv_heads, 1, 1024),
           CheckRange("model config", "head_dim", head_dim, 2, 1024),
           CheckRange("model config", "vocab_size", vocab_size, 1, 1 << 22),
           CheckRange("model config", "max_seq_len", max_seq_len, 1, 1 << 21),
       }) {
    if (!s.ok()) return s;
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: n_heads = ", n_heads,
                                                   " is not a multiple of n_kv_heads = ",
                                                   n_kv_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_dim = ", head_dim, " must be even for RoPE"));
  }
  if (!(rms_eps > 0.0f) || !std::isfinite(rms_eps)) {
    return absl::InvalidArgumentError(absl::StrCat("model config: rms_eps = ", rms_eps));
  }
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(absl::StrCat("model config: rope_theta = ", rope_theta));
  }
  if (rope_scaling.enabled &&
      (!(rope_scaling.factor > 0.0f) || !(rope_scaling.low_freq_factor > 0.0f) ||
       !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
       rope_scaling.original_max_position_embeddings <= 0)) {
    return absl::InvalidArgumentError("model config: rope_scaling values out of range");
  }
  if (bos_id < -1 || bos_id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: bos_id = ", bos_id, " is outside the vocabulary"));
  }
  for (int eos : eos_ids) {
    if (eos < 0 || eos >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: eos id ", eos, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

}  // namespace estuary
