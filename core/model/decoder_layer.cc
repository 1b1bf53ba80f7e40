#include "core/model/decoder_layer.h"

#include <vector>

#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"

namespace estuary {
namespace {

// x += y, after summing y over the tensor-parallel ranks when there are several (each rank's
// o / down projection covers only its heads / MLP columns).
absl::Status AddResidual(const ForwardOptions& options, float* x, std::vector<float>& y) {
  if (options.comm != nullptr && options.comm->size() > 1) {
    ESTUARY_RETURN_IF_ERROR(options.comm->AllReduceSum(
        absl::MakeSpan(y), absl::Now() + options.collective_timeout));
  }
  for (size_t i = 0; i < y.size(); ++i) x[i] += y[i];
  return absl::OkStatus();
}

}  // namespace

absl::Status RunDecoderLayer(const LlamaModel& model, int layer, const LayerProjections& proj,
                             const ForwardOptions& options,
                             absl::Span<const BatchEntry* const> group, float* x, int64_t rows,
                             const KvTap& tap) {
  namespace k = kernels::cpu;
  const LlamaConfig& c = model.config();
  const LlamaLayerWeights& w = model.weights().layers[static_cast<size_t>(layer)];
  const int64_t dim = c.dim, hidden = model.local_hidden_dim(), hd = c.head_dim;
  const int n_heads = model.local_heads(), n_kv_heads = model.local_kv_heads();
  const int64_t q_dim = n_heads * hd, kv_dim = n_kv_heads * hd;
  const k::MatMulOptions& mm = options.matmul;

  std::vector<float> xb(rows * dim), q(rows * q_dim), kk(rows * kv_dim), vv(rows * kv_dim),
      att(rows * q_dim), proj_out(rows * dim), gate(rows * hidden), up(rows * hidden);

  // Attention block.
  k::RmsNorm(x, w.attn_norm, rows, dim, c.rms_eps, xb.data());
  ESTUARY_RETURN_IF_ERROR(proj.wq.Apply(xb.data(), rows, q.data(), mm));
  ESTUARY_RETURN_IF_ERROR(proj.wk.Apply(xb.data(), rows, kk.data(), mm));
  ESTUARY_RETURN_IF_ERROR(proj.wv.Apply(xb.data(), rows, vv.data(), mm));
  int64_t row = 0;
  for (size_t g = 0; g < group.size(); ++g) {
    const BatchEntry& e = *group[g];
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    for (int64_t t = 0; t < n; ++t) {
      const int pos = e.start_pos + static_cast<int>(t);
      k::ApplyRope(q.data() + (row + t) * q_dim, n_heads, c.head_dim, pos,
                   model.rope_inv_freq(), c.rope_style);
      k::ApplyRope(kk.data() + (row + t) * kv_dim, n_kv_heads, c.head_dim, pos,
                   model.rope_inv_freq(), c.rope_style);
      e.kv->Write(layer, pos, kk.data() + (row + t) * kv_dim, vv.data() + (row + t) * kv_dim);
    }
    if (tap) {
      tap(static_cast<int>(g), xb.data() + row * dim, kk.data() + row * kv_dim,
          vv.data() + row * kv_dim);
    }
    e.kv->Attend(layer, q.data() + row * q_dim, static_cast<int>(n), e.start_pos, n_heads,
                 att.data() + row * q_dim, mm.pool != nullptr ? mm.pool->size() : 1);
    row += n;
  }
  ESTUARY_RETURN_IF_ERROR(proj.wo.Apply(att.data(), rows, proj_out.data(), mm));
  ESTUARY_RETURN_IF_ERROR(AddResidual(options, x, proj_out));

  // MLP block.
  k::RmsNorm(x, w.ffn_norm, rows, dim, c.rms_eps, xb.data());
  ESTUARY_RETURN_IF_ERROR(proj.w_gate.Apply(xb.data(), rows, gate.data(), mm));
  ESTUARY_RETURN_IF_ERROR(proj.w_up.Apply(xb.data(), rows, up.data(), mm));
  k::SwiGlu(gate.data(), up.data(), rows * hidden, gate.data());
  ESTUARY_RETURN_IF_ERROR(proj.w_down.Apply(gate.data(), rows, proj_out.data(), mm));
  ESTUARY_RETURN_IF_ERROR(AddResidual(options, x, proj_out));
  return absl::OkStatus();
}

}  // namespace estuary
