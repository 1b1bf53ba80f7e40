#include "core/model/decoder_layer.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/common/worker_pool.h"
#include "core/kernels/cpu/kernels.h"

namespace estuary {
namespace {

// x += y, after summing y over the tensor-parallel ranks when there are several (each rank's
// o / down projection covers only its heads / MLP columns).
absl::Status AddResidual(const ForwardOptions& options, float* x, absl::Span<float> y) {
  if (options.comm != nullptr && options.comm->size() > 1) {
    ESTUARY_RETURN_IF_ERROR(
        options.comm->AllReduceSum(y, absl::Now() + options.collective_timeout));
  }
  for (size_t i = 0; i < y.size(); ++i) x[i] += y[i];
  return absl::OkStatus();
}

// The row-wise kernels (RmsNorm, RoPE, SwiGLU) split a group's rows over the rank's pool only
// from this many rows per part on: prefill chunks and large decode batches. A few rows are
// microseconds of work, less than waking the pool pays for (the matrix products and attention
// split themselves by their own measure). Each row's arithmetic is the same on any thread, so
// the split changes no bit.
constexpr int64_t kMinRowsPerPart = 16;

void ForRowBlocks(WorkerPool* pool, int64_t rows, const WorkerPool::RangeFn& fn) {
  const int64_t parts =
      pool == nullptr ? 1 : std::min<int64_t>(pool->size(), rows / kMinRowsPerPart);
  if (parts <= 1) {
    fn(0, rows);
    return;
  }
  pool->ParallelFor(rows, fn, static_cast<int>(parts));
}

// From this size a pass's activations are mapped and unmapped directly: a prefill chunk's
// (a megabyte on stories260K, 50 MiB on the 1B shape) then never settles in a malloc arena.
constexpr size_t kMappedBytes = size_t{256} << 10;

}  // namespace

LayerWidths LayerWidths::Of(const LlamaModel& model) {
  LayerWidths w{};
  w.n_heads = model.local_heads();
  w.n_kv_heads = model.local_kv_heads();
  w.head_dim = model.config().head_dim;
  w.dim = model.config().dim;
  w.q_dim = w.n_heads * w.head_dim;
  w.kv_dim = w.n_kv_heads * w.head_dim;
  w.hidden = model.local_hidden_dim();
  return w;
}

absl::StatusOr<LayerActivations> LayerActivations::Allocate(const LlamaModel& model,
                                                            int64_t max_rows) {
  LayerActivations a(std::max<int64_t>(max_rows, 0));
  const LayerWidths lw = LayerWidths::Of(model);
  const std::array<int64_t, kBuffers> widths = {lw.dim,   lw.q_dim, lw.kv_dim, lw.kv_dim,
                                                lw.q_dim, lw.dim,   lw.hidden, lw.hidden};
  size_t total = 0;
  for (size_t i = 0; i < kBuffers; ++i) {
    a.offsets_[i] = total;
    total += static_cast<size_t>(a.max_rows_ * widths[i]);
  }
  const size_t bytes = std::max<size_t>(total, 1) * sizeof(float);
  if (bytes < kMappedBytes) {
    a.small_.resize(total);
    a.block_ = a.small_.data();
    return a;
  }
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes of activations for ", a.max_rows_, " rows"));
  }
  a.block_ = static_cast<float*>(mapped);
  a.mapped_bytes_ = bytes;
  return a;
}

// small_'s buffer moves with it (a moved vector keeps its storage), so block_ stays valid.
LayerActivations::LayerActivations(LayerActivations&& other) noexcept
    : max_rows_(other.max_rows_),
      offsets_(other.offsets_),
      block_(std::exchange(other.block_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      small_(std::move(other.small_)) {}

LayerActivations::~LayerActivations() {
  if (mapped_bytes_ > 0) munmap(block_, mapped_bytes_);
}

absl::Status RunDecoderLayer(const LlamaModel& model, int layer, const LayerProjections& proj,
                             const ForwardOptions& options,
                             absl::Span<const BatchEntry* const> group, float* x, int64_t rows,
                             LayerActivations& scratch, const KvTap& tap) {
  namespace k = kernels::cpu;
  const LlamaConfig& c = model.config();
  const LlamaLayerWeights& w = model.weights().layers[static_cast<size_t>(layer)];
  const LayerWidths lw = LayerWidths::Of(model);
  const int64_t dim = lw.dim, hidden = lw.hidden, q_dim = lw.q_dim, kv_dim = lw.kv_dim;
  const int n_heads = lw.n_heads, n_kv_heads = lw.n_kv_heads;
  const k::MatMulOptions& mm = options.matmul;

  if (rows > scratch.max_rows()) {
    return absl::InternalError(
        absl::StrCat("a layer call of ", rows, " rows in a pass sized for ", scratch.max_rows()));
  }
  float* const xb = scratch.xb();
  float* const q = scratch.q();
  float* const kk = scratch.k();
  float* const vv = scratch.v();
  float* const att = scratch.att();
  const absl::Span<float> proj_out(scratch.proj_out(), static_cast<size_t>(rows * dim));
  float* const gate = scratch.gate();
  float* const up = scratch.up();

  // xb = RmsNorm(x) with `norm`, row blocks on the pool.
  const auto rms_norm = [&](const Tensor& norm) {
    ForRowBlocks(mm.pool, rows, [&](int64_t begin, int64_t end) {
      k::RmsNorm(x + begin * dim, norm, end - begin, dim, c.rms_eps, xb + begin * dim);
    });
  };

  // Attention block.
  rms_norm(w.attn_norm);
  ESTUARY_RETURN_IF_ERROR(proj.wq.Apply(xb, rows, q, mm));
  ESTUARY_RETURN_IF_ERROR(proj.wk.Apply(xb, rows, kk, mm));
  ESTUARY_RETURN_IF_ERROR(proj.wv.Apply(xb, rows, vv, mm));
  // RoPE on every row (position of row r: positions[r]), then K/V written per sequence on this
  // thread (a KvView is used by one thread at a time).
  std::vector<int> positions(static_cast<size_t>(rows));
  for (size_t next = 0; const BatchEntry* e : group) {
    for (size_t t = 0; t < e->tokens.size(); ++t) {
      positions[next++] = e->start_pos + static_cast<int>(t);
    }
  }
  ForRowBlocks(mm.pool, rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int pos = positions[static_cast<size_t>(r)];
      k::ApplyRope(q + r * q_dim, n_heads, c.head_dim, pos, model.rope_inv_freq(), c.rope_style);
      k::ApplyRope(kk + r * kv_dim, n_kv_heads, c.head_dim, pos, model.rope_inv_freq(),
                   c.rope_style);
    }
  });
  int64_t row = 0;
  for (size_t g = 0; g < group.size(); ++g) {
    const BatchEntry& e = *group[g];
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    for (int64_t t = 0; t < n; ++t) {
      e.kv->Write(layer, e.start_pos + static_cast<int>(t), kk + (row + t) * kv_dim,
                  vv + (row + t) * kv_dim);
    }
    if (tap) tap(static_cast<int>(g), xb + row * dim, kk + row * kv_dim, vv + row * kv_dim);
    e.kv->Attend(layer, q + row * q_dim, static_cast<int>(n), e.start_pos, n_heads,
                 att + row * q_dim, mm.pool);
    row += n;
  }
  ESTUARY_RETURN_IF_ERROR(proj.wo.Apply(att, rows, proj_out.data(), mm));
  ESTUARY_RETURN_IF_ERROR(AddResidual(options, x, proj_out));

  // MLP block.
  rms_norm(w.ffn_norm);
  ESTUARY_RETURN_IF_ERROR(proj.w_gate.Apply(xb, rows, gate, mm));
  ESTUARY_RETURN_IF_ERROR(proj.w_up.Apply(xb, rows, up, mm));
  ForRowBlocks(mm.pool, rows, [&](int64_t begin, int64_t end) {
    k::SwiGlu(gate + begin * hidden, up + begin * hidden, (end - begin) * hidden,
              gate + begin * hidden);
  });
  ESTUARY_RETURN_IF_ERROR(proj.w_down.Apply(gate, rows, proj_out.data(), mm));
  ESTUARY_RETURN_IF_ERROR(AddResidual(options, x, proj_out));
  return absl::OkStatus();
}

}  // namespace estuary
