#pragma once
// WidenLlama2cToHf (`estuary widen`): a trained llama2.c model written into a larger model's
// widths as the same function, so that a benchmark gets a real model's behaviour (its exit
// depths, its draft acceptance, real text) at the cost of a realistic model (every byte of the
// larger matrices is read; the kernels do not skip zeros). A random-weight model of the same
// shape gives flat distributions, so an early-exit or speculative figure measured on it says
// little; a tiny trained model says little about cost. This gives both at once.
//
// How the function is kept (all in Hugging Face's RoPE halves layout; "s" small, "w" wide):
//   - the residual stream's dim_s values sit in the first dim_s of dim_w places, the rest stay
//     exactly zero: every matrix that writes the residual (embedding, o, down) writes only
//     there, every matrix that reads it has zero columns elsewhere;
//   - RMSNorm over dim_w with those zeros is dim_s's RMSNorm times sqrt(dim_w / dim_s): the
//     norm weights are scaled by sqrt(dim_s / dim_w) and eps by dim_s / dim_w;
//   - small KV head j is wide KV head j; small query head h of GQA group g (rank r in it) is
//     wide query head g * group_w + r; the other heads' q/k/v rows and o columns are zero;
//   - within a head, small RoPE pair p (frequency theta^(-2p/hd_s)) is wide pair
//     p * hd_w / hd_s, which has the same frequency; q rows are scaled by sqrt(hd_w / hd_s) so
//     that q.k / sqrt(hd_w) is the small q.k / sqrt(hd_s);
//   - MLP unit j is wide unit j; the others have zero gate/up rows and down columns.
// The scales are exact in any dtype when the ratios are powers of 4 (stories12L into the 1B
// widths: 16 and 4); otherwise the function is kept up to the scales' rounding. Summation
// order over the longer rows differs, so f32 results agree to rounding, not bit for bit.
//
// Layers, vocabulary, context, RoPE theta, special ids and the tokenizer come from the small
// model; the widths (dim, hidden_dim, heads, KV heads, head_dim) from `widths`.

#include <string>

#include "absl/status/status.h"
#include "core/model/llama_config.h"
#include "core/tensor/dtype.h"

namespace estuary {

// Writes config.json, generation_config.json, tokenizer.json and model.safetensors (in `dtype`:
// f32, bf16 or f16) to `to_dir`. INVALID_ARGUMENT when a width of `widths` is smaller than the
// small model's, when head_dim does not divide, or when a GQA group would not fit.
absl::Status WidenLlama2cToHf(const std::string& from_dir_or_model_bin,
                              const LlamaConfig& widths, const std::string& to_dir, DType dtype);

}  // namespace estuary
