#include "core/model/decoder_layer.h"

#include <vector>

#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"

namespace estuary {
namespace {
void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}
}  // namespace

absl::Status RunDecoderLayer(const LlamaModel& model, int layer, const LayerProjections& proj,
                             absl::Span<const BatchEntry* const> group, float* x, int64_t rows,
                             const KvTap& tap) {
  namespace k = kernels::cpu;
  const LlamaConfig& c = model.config();
  const LlamaLayerWeights& w = model.weights().layers[static_cast<size_t>(layer)];
  const int64_t dim = c.dim, hidden = c.hidden_dim, hd = c.head_dim;
  const int64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;

  std::vector<float> xb(rows * dim), q(rows * q_dim), kk(rows * kv_dim), vv(rows * kv_dim),
      att(rows * q_dim), proj_out(rows * dim), gate(rows * hidden), up(rows * hidden);

  // Attention block.
  k::RmsNorm(x, w.attn_norm, rows, dim, c.rms_eps, xb.data());
  ESTUARY_RETURN_IF_ERROR(proj.wq.Apply(xb.data(), rows, q.data()));
  ESTUARY_RETURN_IF_ERROR(proj.wk.Apply(xb.data(), rows, kk.data()));
  ESTUARY_RETURN_IF_ERROR(proj.wv.Apply(xb.data(), rows, vv.data()));
  int64_t row = 0;
  for (size_t g = 0; g < group.size(); ++g) {
    const BatchEntry& e = *group[g];
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    for (int64_t t = 0; t < n; ++t) {
      const int pos = e.start_pos + static_cast<int>(t);
      k::ApplyRope(q.data() + (row + t) * q_dim, c.n_heads, c.head_dim, pos,
                   model.rope_inv_freq(), c.rope_style);
      k::ApplyRope(kk.data() + (row + t) * kv_dim, c.n_kv_heads, c.head_dim, pos,
                   model.rope_inv_freq(), c.rope_style);
      e.kv->Write(layer, pos, kk.data() + (row + t) * kv_dim, vv.data() + (row + t) * kv_dim);
    }
    if (tap) {
      tap(static_cast<int>(g), xb.data() + row * dim, kk.data() + row * kv_dim,
          vv.data() + row * kv_dim);
    }
    e.kv->Attend(layer, q.data() + row * q_dim, static_cast<int>(n), e.start_pos, c.n_heads,
                 att.data() + row * q_dim);
    row += n;
  }
  ESTUARY_RETURN_IF_ERROR(proj.wo.Apply(att.data(), rows, proj_out.data()));
  AddInPlace(x, proj_out.data(), rows * dim);

  // MLP block.
  k::RmsNorm(x, w.ffn_norm, rows, dim, c.rms_eps, xb.data());
  ESTUARY_RETURN_IF_ERROR(proj.w_gate.Apply(xb.data(), rows, gate.data()));
  ESTUARY_RETURN_IF_ERROR(proj.w_up.Apply(xb.data(), rows, up.data()));
  k::SwiGlu(gate.data(), up.data(), rows * hidden, gate.data());
  ESTUARY_RETURN_IF_ERROR(proj.w_down.Apply(gate.data(), rows, proj_out.data()));
  AddInPlace(x, proj_out.data(), rows * dim);
  return absl::OkStatus();
}

}  // namespace estuary
