#include "core/model/cuda/device_decoder.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/kernels/cuda/decode_step_kernels.h"
#include "core/kernels/cuda/elementwise.h"
#include "core/kernels/cuda/paged_attention.h"
#include "core/kvcache/kv_layout.h"

namespace estuary::cuda {
namespace {

constexpr int kMaxRowsLimit = 1024;  // the exit kernel's bound

int NextPowerOfTwo(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Device memory for the KV pool's layer regions: zeroed, freed with the pool.
absl::StatusOr<KvRegionMemory> AllocateDeviceRegion(size_t bytes) {
  void* data = nullptr;
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&data, bytes), absl::StrCat("KV region of ", bytes, " bytes")));
  std::shared_ptr<void> owner(data, [](void* p) { cudaFree(p); });
  ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaMemset(data, 0, bytes), "KV region memset"));
  return KvRegionMemory{data, std::move(owner)};
}

// The paths one layer's projections may take in a step, with the weights of each. Kernels of a
// path that no row can take in this layer are not launched at all; those of a path no row takes
// in this step return before reading their weights.
struct LayerPaths {
  const DeviceLayerDense* backbone = nullptr;  // null: no row can be on the backbone here
  const DeviceLayerInt4* river = nullptr;      // null: no row can be on the river here
  const int32_t* row_path = nullptr;           // null: the model has no river (every row counts)
  int bucket = 0;
  cudaStream_t stream = nullptr;
  // Set when every row is on the backbone, the weights are bf16 and the bucket is large: the
  // backbone's products are cuBLAS GEMMs over all rows (padding rows included, never read).
  CublasHandle* cublas = nullptr;
};

// y = W x on cuBLAS for a bf16 matrix.
absl::Status GemmBf16(CublasHandle& cublas, const DeviceDense& w, const float* x, int bucket,
                      float* y) {
  return MatMulBf16(cublas, static_cast<const uint16_t*>(static_cast<const void*>(w.memory.get())),
                    w.out_features, w.in_features, x, bucket, y);
}

// One product of a layer, named by the matrix on each path and its output.
struct Projection {
  const DeviceDense DeviceLayerDense::*dense;
  const Int4GpuMatrix DeviceLayerInt4::*int4;
  float* y;
};

// y = W x for every projection in `projections` (which share the input x): one launch per path.
absl::Status Project(const LayerPaths& paths, std::initializer_list<Projection> projections,
                     const float* x) {
  if (paths.cublas != nullptr) {
    for (const Projection& p : projections) {
      ESTUARY_RETURN_IF_ERROR(
          GemmBf16(*paths.cublas, paths.backbone->*p.dense, x, paths.bucket, p.y));
    }
    return absl::OkStatus();
  }
  if (paths.backbone != nullptr) {
    std::vector<DenseSegment> segments;
    for (const Projection& p : projections) {
      const DeviceDense& w = paths.backbone->*p.dense;
      segments.push_back({w.memory.get(), w.out_features, p.y});
    }
    const DeviceDense& first = paths.backbone->*projections.begin()->dense;
    ESTUARY_RETURN_IF_ERROR(DenseMatMulRowsMulti(segments, first.dtype, first.in_features, x,
                                                 paths.bucket, paths.row_path, kRowBackbone,
                                                 paths.stream));
  }
  if (paths.river == nullptr) return absl::OkStatus();
  std::vector<Int4Segment> segments;
  for (const Projection& p : projections) segments.push_back({(paths.river->*p.int4).view(), p.y});
  return Int4MatMulRowsMulti(segments, x, paths.bucket, paths.row_path, kRowRiver, paths.stream);
}

// y = W_down (silu(gate) * up), the activation computed as the kernels load their input.
// `gate` is scratch: the cuBLAS path writes silu(gate) * up into it first.
absl::Status ProjectDown(const LayerPaths& paths, float* gate, const float* up, int64_t hidden,
                         float* y) {
  if (paths.cublas != nullptr) {
    ESTUARY_RETURN_IF_ERROR(SwiGlu(gate, up, paths.bucket * hidden, gate, paths.stream));
    return GemmBf16(*paths.cublas, paths.backbone->w_down, gate, paths.bucket, y);
  }
  if (paths.backbone != nullptr) {
    const DeviceDense& w = paths.backbone->w_down;
    ESTUARY_RETURN_IF_ERROR(DenseMatMulRowsSwiGlu(w.memory.get(), w.dtype, w.out_features,
                                                  w.in_features, gate, up, paths.bucket,
                                                  paths.row_path, kRowBackbone, y, paths.stream));
  }
  if (paths.river == nullptr) return absl::OkStatus();
  return Int4MatMulRowsSwiGlu(paths.river->w_down.view(), gate, up, paths.bucket, paths.row_path,
                              kRowRiver, y, paths.stream);
}

}  // namespace

KvRegionAllocator DeviceKvRegionAllocator() { return AllocateDeviceRegion; }

// The per-step inputs are packed into one int32 array, uploaded with one copy; each field is a
// fixed slice so that captured graphs keep pointing at the right place.
struct DeviceDecoder::Buffers {
  // Offsets (in int32 elements) of the input fields inside `inputs`.
  size_t tokens = 0, positions = 0, seq_lens = 0, row_group = 0, thresholds = 0, row_path = 0,
         backbone_layers = 0, page_table = 0, total = 0;
  PinnedArray<int32_t> host_inputs;
  DeviceArray<int32_t> inputs;

  // similarity: ExitDecision's per-row cosines (one float per row).
  DeviceArray<float> x, layer_in, xb, q, k, v, att, proj, gate, up, similarity, logits;
  DeviceArray<int32_t> out_ids;
  DeviceArray<int32_t> error_flags;  // [0] embedding, [1] KV write
  DeviceArray<uint8_t> attention_workspace;
  PagedAttentionDecodeArgs attention;  // the fields that do not change per layer

  PinnedArray<int32_t> host_ids, host_backbone_layers, host_flags;

  int32_t* in(size_t offset) const { return inputs.get() + offset; }
};

DeviceDecoder::DeviceDecoder(const DeviceModel& model, const DeviceDecoderOptions& options)
    : model_(model), options_(options) {}

DeviceDecoder::~DeviceDecoder() {
  // Work in flight may still read the buffers: let it finish before they are freed.
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
}

absl::StatusOr<std::unique_ptr<DeviceDecoder>> DeviceDecoder::Create(
    const DeviceModel& model, const DeviceDecoderOptions& options) {
  auto decoder = std::unique_ptr<DeviceDecoder>(new DeviceDecoder(model, options));
  ESTUARY_RETURN_IF_ERROR(decoder->Init());
  return decoder;
}

absl::Status DeviceDecoder::Init() {
  const LlamaConfig& c = model_.config();
  if (options_.max_rows < 1 || options_.max_rows > kMaxRowsLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows must be in [1, ", kMaxRowsLimit, "], got ", options_.max_rows));
  }
  options_.max_rows = std::min(NextPowerOfTwo(options_.max_rows), kMaxRowsLimit);
  max_seq_len_ = options_.max_seq_len > 0 ? options_.max_seq_len : std::min(c.max_seq_len, 8192);
  if (max_seq_len_ < 1 || max_seq_len_ > c.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_seq_len must be in [1, ", c.max_seq_len, "], got ", max_seq_len_));
  }
  if (options_.block_size < 1) {
    return absl::InvalidArgumentError("block_size must be positive");
  }
  pages_per_seq_ = (max_seq_len_ + options_.block_size - 1) / options_.block_size;
  forced_exit_ = c.n_layers;
  if (model_.has_river() && options_.exits) {
    ESTUARY_RETURN_IF_ERROR(options_.policy.Validate(c.n_layers));
    // The device's exit kernel (ExitDecision) implements batch_min and split only.
    if (options_.policy.rule == ExitRule::kAllPassed) {
      return absl::FailedPreconditionError(
          "exit rule all_passed runs on CPU ranks; on a GPU use batch_min or split");
    }
    forced_exit_ = options_.policy.ForcedExitAfter(c.n_layers);
    if (forced_exit_ < c.n_layers && !model_.river_has_layer(forced_exit_)) {
      return absl::FailedPreconditionError(absl::StrCat("forced exit after ", forced_exit_,
                                                        " layers needs river layer ", forced_exit_,
                                                        ", which the river lacks"));
    }
  }

  ESTUARY_ASSIGN_OR_RETURN(stream_, StreamHandle::Create());
  if (!options_.exits && model_.backbone(0).wq.dtype == DType::kBF16 &&
      options_.max_rows >= kCublasMinRows) {
    // Sized for the widest input (the padded MLP width) at max_rows rows, before any capture.
    const size_t widest = static_cast<size_t>(
        std::max<int64_t>({c.dim, int64_t{c.n_heads} * c.head_dim, model_.padded_hidden()}));
    ESTUARY_ASSIGN_OR_RETURN(CublasHandle cublas, CublasHandle::Create(stream_.get()));
    ESTUARY_RETURN_IF_ERROR(cublas.PrepareForCapture(
        static_cast<size_t>(options_.max_rows) * widest * sizeof(uint16_t), size_t{32} << 20));
    cublas_ = std::move(cublas);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    ESTUARY_ASSIGN_OR_RETURN(EventHandle event, EventHandle::Create(cudaEventDisableTiming));
    layer_done_.push_back(std::move(event));
  }
  const KvLayout layout = KvLayout::FromConfig(c, options_.block_size);
  if (options_.shared_pool != nullptr) {
    const KvLayout& shared = options_.shared_pool->layout();
    if (shared.n_layers != layout.n_layers || shared.n_kv_heads != layout.n_kv_heads ||
        shared.head_dim != layout.head_dim || shared.block_size != layout.block_size ||
        options_.shared_pool->num_shards() != 1) {
      return absl::InvalidArgumentError("the shared KV pool's layout is not this model's");
    }
    pool_ = options_.shared_pool;
  } else {
    ESTUARY_ASSIGN_OR_RETURN(
        owned_pool_, KvPool::Create(layout, options_.kv_cache_bytes, 1, AllocateDeviceRegion));
    pool_ = owned_pool_.get();
  }

  auto b = std::make_unique<Buffers>();
  const size_t rows = static_cast<size_t>(options_.max_rows);
  size_t at = 0;
  for (size_t* field : {&b->tokens, &b->positions, &b->seq_lens, &b->row_group, &b->thresholds,
                        &b->row_path, &b->backbone_layers}) {
    *field = at;
    at += rows;
  }
  b->page_table = at;
  at += rows * static_cast<size_t>(pages_per_seq_);
  b->total = at;
  ESTUARY_ASSIGN_OR_RETURN(b->host_inputs, PinnedArray<int32_t>::Create(b->total));
  ESTUARY_ASSIGN_OR_RETURN(b->inputs, DeviceArray<int32_t>::Create(b->total));

  const size_t dim = static_cast<size_t>(c.dim);
  const size_t q_dim = static_cast<size_t>(c.n_heads) * static_cast<size_t>(c.head_dim);
  const size_t kv_dim = static_cast<size_t>(c.n_kv_heads) * static_cast<size_t>(c.head_dim);
  const size_t hidden = static_cast<size_t>(model_.padded_hidden());
  for (auto [array, width] : std::initializer_list<std::pair<DeviceArray<float>*, size_t>>{
           {&b->x, dim},
           {&b->layer_in, dim},
           {&b->xb, dim},
           {&b->q, q_dim},
           {&b->k, kv_dim},
           {&b->v, kv_dim},
           {&b->att, q_dim},
           {&b->proj, dim},
           {&b->gate, hidden},
           {&b->up, hidden},
           {&b->similarity, 1},
           {&b->logits, static_cast<size_t>(c.vocab_size)}}) {
    ESTUARY_ASSIGN_OR_RETURN(*array, DeviceArray<float>::Create(rows * width));
  }
  ESTUARY_ASSIGN_OR_RETURN(b->out_ids, DeviceArray<int32_t>::Create(rows));
  ESTUARY_ASSIGN_OR_RETURN(b->error_flags, DeviceArray<int32_t>::Create(2));
  ESTUARY_ASSIGN_OR_RETURN(b->host_ids, PinnedArray<int32_t>::Create(rows));
  ESTUARY_ASSIGN_OR_RETURN(b->host_backbone_layers, PinnedArray<int32_t>::Create(rows));
  ESTUARY_ASSIGN_OR_RETURN(b->host_flags, PinnedArray<int32_t>::Create(2));

  PagedAttentionDecodeArgs& a = b->attention;
  a.q = b->q.get();
  a.page_table = b->in(b->page_table);
  a.page_table_stride = pages_per_seq_;
  a.seq_lens = b->in(b->seq_lens);
  a.n_seq = options_.max_rows;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.block_size = options_.block_size;
  a.max_seq_len = max_seq_len_;
  a.out = b->att.get();
  // Flash-decoding splits keep a batch-1 step's long context spread over the SMs; at most 16
  // per sequence, since a captured graph launches every split even for short sequences.
  a.split_positions = max_seq_len_ > 512 ? std::max(512, (max_seq_len_ + 15) / 16) : 0;
  const size_t workspace = PagedAttentionDecodeWorkspaceBytes(a);
  ESTUARY_ASSIGN_OR_RETURN(b->attention_workspace, DeviceArray<uint8_t>::Create(workspace));
  a.workspace = b->attention_workspace.get();
  a.workspace_bytes = workspace;
  buffers_ = std::move(b);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> DeviceDecoder::AddSequence() {
  const int32_t handle = next_sequence_++;
  sequences_.emplace(handle, SequenceKv(pool_));
  return handle;
}

void DeviceDecoder::ReleaseSequence(int32_t sequence) { sequences_.erase(sequence); }

int DeviceDecoder::BucketFor(int rows) const {
  return std::min(NextPowerOfTwo(rows), options_.max_rows);
}

absl::Status DeviceDecoder::CheckRows(absl::Span<const DeviceStepRow> rows,
                                      bool pages_reserved) const {
  const LlamaConfig& c = model_.config();
  if (rows.empty()) return absl::InvalidArgumentError("a step needs at least one row");
  if (static_cast<int>(rows.size()) > options_.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step has at most ", options_.max_rows, " rows, got ", rows.size()));
  }
  std::vector<const SequenceKv*> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const DeviceStepRow& r = rows[i];
    if (r.kv == nullptr || r.kv->pool() != pool_) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", i, ": its sequence is not a sequence of this decoder's pool"));
    }
    if (r.token < 0 || r.token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("row ", i, ": token ", r.token,
                                                     " outside the vocabulary of ", c.vocab_size));
    }
    if (r.position < 0 || r.position >= max_seq_len_) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", i, ": position ", r.position, " outside [0, ", max_seq_len_, ")"));
    }
    if (pages_reserved && r.position >= r.kv->capacity()) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", i, ": position ", r.position, " beyond the sequence's pages"));
    }
    const bool continues = i > 0 && rows[i - 1].kv == r.kv;
    if (continues && r.position != rows[i - 1].position + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", i, ": rows of one sequence must have consecutive positions"));
    }
    if (!continues) {
      if (std::find(seen.begin(), seen.end(), r.kv) != seen.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("row ", i, ": rows of one sequence must be consecutive"));
      }
      seen.push_back(r.kv);
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceDecoder::EnqueueLayer(int l, int bucket) {
  const LlamaConfig& c = model_.config();
  Buffers& b = *buffers_;
  cudaStream_t s = stream_.get();
  const int64_t rows = bucket;
  // River rows are possible in this layer only once an exit may have happened before it;
  // backbone rows are impossible from the forced exit on (full int4, fixed-exit evaluation).
  const bool river_rows =
      options_.exits && model_.river_has_layer(l) &&
      (l >= forced_exit_ || l >= std::max(1, options_.policy.min_backbone_layers));
  const bool backbone_rows = l < forced_exit_;
  LayerPaths paths;
  paths.backbone = backbone_rows ? &model_.backbone(l) : nullptr;
  paths.river = river_rows ? &model_.river(l) : nullptr;
  paths.row_path = model_.has_river() ? b.in(b.row_path) : nullptr;
  paths.bucket = bucket;
  paths.stream = s;
  if (cublas_.has_value() && bucket >= kCublasMinRows) paths.cublas = &*cublas_;
  using D = DeviceLayerDense;
  using Q = DeviceLayerInt4;

  // The exit decision after this layer needs its input; none is taken once no row can be on
  // the backbone.
  const bool decide = options_.exits && model_.has_river() && backbone_rows && l + 1 < c.n_layers;
  if (decide) {
    ESTUARY_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(b.layer_in.get(), b.x.get(), sizeof(float) * rows * c.dim,
                                   cudaMemcpyDeviceToDevice, s),
                   "layer input copy"));
  }
  // Attention block; xb holds RMSNorm(x) * attn_norm (the previous layer's fused kernel).
  ESTUARY_RETURN_IF_ERROR(Project(
      paths,
      {{&D::wq, &Q::wq, b.q.get()}, {&D::wk, &Q::wk, b.k.get()}, {&D::wv, &Q::wv, b.v.get()}},
      b.xb.get()));
  const KvRegion region = pool_->layer_region(l);
  const PageShape shape{c.n_kv_heads, options_.block_size, c.head_dim};
  ESTUARY_RETURN_IF_ERROR(RopeWriteKvRows(
      b.q.get(), c.n_heads, b.k.get(), b.v.get(), c.n_kv_heads, c.head_dim, b.in(b.positions), rows,
      model_.rope_inv_freq().get(), c.rope_style, b.in(b.page_table), pages_per_seq_,
      static_cast<float*>(region.data), pool_->num_pages(), shape, b.error_flags.get() + 1, s));
  PagedAttentionDecodeArgs attention = b.attention;
  attention.kv_layer = static_cast<const float*>(region.data);
  attention.n_seq = bucket;
  ESTUARY_RETURN_IF_ERROR(PagedAttentionDecode(attention, s));
  ESTUARY_RETURN_IF_ERROR(Project(paths, {{&D::wo, &Q::wo, b.proj.get()}}, b.att.get()));
  const DeviceLayerNorms& norms = model_.norms(l);
  // The per-add cosine this kernel can write is not the exit's (that spans the whole layer,
  // ExitDecision below): none is asked for.
  ESTUARY_RETURN_IF_ERROR(ResidualRmsNormSimilarity(b.x.get(), b.proj.get(), norms.ffn_norm.get(),
                                                    DType::kF32, rows, c.dim, c.rms_eps, b.xb.get(),
                                                    /*similarity=*/nullptr, s));
  // MLP block (padded width: the pad rows of gate/up are zero, so silu(0) * 0 = 0 feeds down).
  ESTUARY_RETURN_IF_ERROR(
      Project(paths, {{&D::w_gate, &Q::w_gate, b.gate.get()}, {&D::w_up, &Q::w_up, b.up.get()}},
              b.xb.get()));
  ESTUARY_RETURN_IF_ERROR(
      ProjectDown(paths, b.gate.get(), b.up.get(), model_.padded_hidden(), b.proj.get()));
  // x += down; xb = RMSNorm(x) with the next layer's attention norm (or the final norm).
  const bool last = l + 1 == c.n_layers;
  const float* next_norm = last ? model_.final_norm().get() : model_.norms(l + 1).attn_norm.get();
  ESTUARY_RETURN_IF_ERROR(ResidualRmsNormSimilarity(b.x.get(), b.proj.get(), next_norm, DType::kF32,
                                                    rows, c.dim, c.rms_eps, b.xb.get(),
                                                    /*similarity=*/nullptr, s));
  // This layer's KV is written (RopeWriteKvRows above): consumers may read it from here on.
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(layer_done_[static_cast<size_t>(l)].get(), s), "layer event"));
  if (!decide) return absl::OkStatus();

  // The exit decision for layer l + 1, on the device (forward_batch.cc is the CPU reference).
  const int next = l + 1;
  ExitDecisionArgs exit;
  exit.layer_in = b.layer_in.get();
  exit.layer_out = b.x.get();
  exit.dim = c.dim;
  exit.n_rows = bucket;
  exit.row_group = b.in(b.row_group);
  exit.thresholds = reinterpret_cast<const float*>(b.in(b.thresholds));
  exit.row_path = b.in(b.row_path);
  exit.backbone_layers = b.in(b.backbone_layers);
  exit.similarity = b.similarity.get();  // one block per row for the cosines, then the decision
  exit.next_layer = next;
  exit.rule = static_cast<int>(options_.policy.rule);
  exit.may_exit =
      model_.river_has_layer(next) && next >= std::max(1, options_.policy.min_backbone_layers);
  exit.forced = next >= forced_exit_;
  return ExitDecision(exit, s);
}

absl::Status DeviceDecoder::EnqueueForward(int bucket) {
  const LlamaConfig& c = model_.config();
  Buffers& b = *buffers_;
  cudaStream_t s = stream_.get();
  const DeviceDense& table = model_.embedding();
  ESTUARY_RETURN_IF_ERROR(Embedding(table.memory.get(), table.dtype, table.out_features,
                                    table.in_features, b.in(b.tokens), bucket, b.x.get(),
                                    b.error_flags.get(), s));
  ESTUARY_RETURN_IF_ERROR(RmsNorm(b.x.get(), model_.norms(0).attn_norm.get(), DType::kF32, bucket,
                                  c.dim, c.rms_eps, b.xb.get(), s));
  for (int l = 0; l < c.n_layers; ++l) ESTUARY_RETURN_IF_ERROR(EnqueueLayer(l, bucket));
  const DeviceDense& head = model_.lm_head();
  ESTUARY_RETURN_IF_ERROR(DenseMatMulRows(head.memory.get(), head.dtype, head.out_features,
                                          head.in_features, b.xb.get(), bucket, nullptr,
                                          kRowBackbone, b.logits.get(), s));
  return ArgmaxRows(b.logits.get(), bucket, c.vocab_size, b.out_ids.get(), s);
}

absl::Status DeviceDecoder::Step(absl::Span<const DeviceRow> rows,
                                 absl::Span<DeviceRowResult> results, absl::Span<float> logits) {
  std::vector<DeviceStepRow> step_rows;
  step_rows.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const DeviceRow& r = rows[i];
    auto it = sequences_.find(r.sequence);
    if (it == sequences_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("row ", i, ": unknown sequence ", r.sequence));
    }
    if (r.position < 0 || r.position >= max_seq_len_) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", i, ": position ", r.position, " outside [0, ", max_seq_len_, ")"));
    }
    step_rows.push_back({&it->second, r.token, r.position, r.exit_threshold, !logits.empty()});
  }
  // Check before reserving, so that a refused step allocates nothing.
  ESTUARY_RETURN_IF_ERROR(CheckRows(step_rows, /*pages_reserved=*/false));
  for (size_t i = 0; i < rows.size(); ++i) {
    ESTUARY_RETURN_IF_ERROR(sequences_.at(rows[i].sequence).Reserve(rows[i].position + 1));
  }
  return Run(step_rows, results, logits);
}

absl::Status DeviceDecoder::Run(absl::Span<const DeviceStepRow> rows,
                                absl::Span<DeviceRowResult> results, absl::Span<float> logits,
                                const std::function<void(int layer)>& on_layer_done) {
  const LlamaConfig& c = model_.config();
  if (results.size() != rows.size()) {
    return absl::InvalidArgumentError("results must have one element per row");
  }
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  const size_t wanted = static_cast<size_t>(std::count_if(
      rows.begin(), rows.end(), [](const DeviceStepRow& r) { return r.want_logits; }));
  if (logits.size() != wanted * vocab) {
    return absl::InvalidArgumentError(absl::StrCat("logits must hold vocab floats for each of the ",
                                                   wanted, " rows that want them"));
  }
  ESTUARY_RETURN_IF_ERROR(CheckRows(rows, /*pages_reserved=*/true));
  Buffers& b = *buffers_;
  cudaStream_t s = stream_.get();
  const int bucket = BucketFor(static_cast<int>(rows.size()));

  // Stage the inputs; padding rows are idle at position -1 with nothing to attend. Only the
  // page-table entries the rows use are written and uploaded: entries past a row's last page are
  // never read (attention stops at its length, the KV write at its position's page).
  int32_t* host = b.host_inputs.get();
  size_t table_width = 1;
  const int32_t start_path = forced_exit_ == 0 ? kRowRiver : kRowBackbone;
  const int32_t start_layers = forced_exit_ == 0 ? 0 : c.n_layers;
  int group_start = 0;
  for (int i = 0; i < bucket; ++i) {
    int32_t* table = host + b.page_table + static_cast<size_t>(i) * pages_per_seq_;
    if (i >= static_cast<int>(rows.size())) {
      host[b.tokens + i] = 0;
      host[b.positions + i] = -1;
      host[b.seq_lens + i] = 0;
      host[b.row_group + i] = i;
      host[b.row_path + i] = kRowIdle;
      host[b.backbone_layers + i] = 0;
      std::memcpy(host + b.thresholds + i, &rows[0].exit_threshold, sizeof(float));
      continue;
    }
    const DeviceStepRow& r = rows[static_cast<size_t>(i)];
    if (i == 0 || rows[static_cast<size_t>(i) - 1].kv != r.kv) group_start = i;
    host[b.tokens + i] = r.token;
    host[b.positions + i] = r.position;
    host[b.seq_lens + i] = r.position + 1;
    host[b.row_group + i] = group_start;
    host[b.row_path + i] = start_path;
    host[b.backbone_layers + i] = start_layers;
    std::memcpy(host + b.thresholds + i, &r.exit_threshold, sizeof(float));
    // The pages up to the row's position: at most pages_per_seq_, as positions are below
    // max_seq_len_ (CheckRows), and at most the sequence's pages (reserved up to it).
    const std::vector<int32_t>& pages = r.kv->pages();
    const size_t used =
        std::min<size_t>(pages.size(), static_cast<size_t>(r.position / options_.block_size + 1));
    std::copy(pages.begin(), pages.begin() + static_cast<std::ptrdiff_t>(used), table);
    table_width = std::max(table_width, used);
  }
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(b.inputs.get(), host, b.page_table * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, s),
                 "step input upload"));
  const size_t pitch = static_cast<size_t>(pages_per_seq_) * sizeof(int32_t);
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy2DAsync(b.in(b.page_table), pitch, host + b.page_table, pitch,
                                   table_width * sizeof(int32_t), static_cast<size_t>(bucket),
                                   cudaMemcpyHostToDevice, s),
                 "page table upload"));
  ESTUARY_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(b.error_flags.get(), 0, 2 * sizeof(int32_t), s), "error flag reset"));

  if (!options_.use_graphs) {
    ESTUARY_RETURN_IF_ERROR(EnqueueForward(bucket));
  } else {
    auto it = graphs_.find(bucket);
    if (it == graphs_.end()) {
      // Capture the step once for this bucket; later steps replay it.
      ESTUARY_RETURN_IF_ERROR(CudaStatus(
          cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin graph capture"));
      const absl::Status enqueued = EnqueueForward(bucket);
      cudaGraph_t graph = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(s, &graph);
      if (!enqueued.ok()) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        return enqueued;
      }
      ESTUARY_RETURN_IF_ERROR(CudaStatus(ended, "end graph capture"));
      size_t nodes = 0;
      ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaGraphGetNodes(graph, nullptr, &nodes), "graph nodes"));
      graph_nodes_[bucket] = nodes;
      ESTUARY_ASSIGN_OR_RETURN(GraphExecHandle exec, GraphExecHandle::Instantiate(graph));
      it = graphs_.emplace(bucket, std::move(exec)).first;
    }
    ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(it->second.get(), s), "graph launch"));
  }

  if (on_layer_done) {
    for (int l = 0; l < c.n_layers; ++l) {
      ESTUARY_RETURN_IF_ERROR(CudaStatus(
          cudaEventSynchronize(layer_done_[static_cast<size_t>(l)].get()), "layer wait"));
      on_layer_done(l);
    }
  }
  const size_t n = rows.size();
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(b.host_ids.get(), b.out_ids.get(), n * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, s),
                 "token download"));
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(b.host_backbone_layers.get(), b.in(b.backbone_layers),
                                 n * sizeof(int32_t), cudaMemcpyDeviceToHost, s),
                 "backbone layers download"));
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(b.host_flags.get(), b.error_flags.get(), 2 * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, s),
                 "error flag download"));
  // The wanted rows' logits, one copy per run of consecutive wanted rows.
  size_t out_row = 0;
  for (size_t i = 0; i < n;) {
    if (!rows[i].want_logits) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < n && rows[end].want_logits) ++end;
    ESTUARY_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(logits.data() + out_row * vocab, b.logits.get() + i * vocab,
                                   (end - i) * vocab * sizeof(float), cudaMemcpyDeviceToHost, s),
                   "logits download"));
    out_row += end - i;
    i = end;
  }
  ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), "decode step"));
  if (b.host_flags.get()[0] != 0 || b.host_flags.get()[1] != 0) {
    return absl::InternalError(absl::StrCat("decode step: device bounds check failed (embedding ",
                                            b.host_flags.get()[0], ", KV write ",
                                            b.host_flags.get()[1], ")"));
  }
  for (size_t i = 0; i < n; ++i) {
    results[i].next_token = b.host_ids.get()[i];
    results[i].backbone_layers = b.host_backbone_layers.get()[i];
    // Provenance of the written position: its last backbone layer, as the CPU path records it.
    const int ran = results[i].backbone_layers;
    const uint8_t provenance = ran == c.n_layers ? kProvenanceFullDepth
                               : ran == 0        ? kProvenanceNoBackbone
                                                 : static_cast<uint8_t>(ran - 1);
    const DeviceStepRow& r = rows[i];
    const int32_t page = r.kv->pages()[static_cast<size_t>(r.position / options_.block_size)];
    pool_->provenance(page)[r.position % options_.block_size] = provenance;
  }
  return absl::OkStatus();
}

absl::Status DeviceDecoder::Prefill(int32_t sequence, absl::Span<const int32_t> tokens,
                                    int start_pos, float exit_threshold, DeviceRowResult& last) {
  if (tokens.empty()) return absl::InvalidArgumentError("prefill needs at least one token");
  std::vector<DeviceRow> rows;
  std::vector<DeviceRowResult> results;
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(options_.max_rows)) {
    const size_t end = std::min(tokens.size(), begin + static_cast<size_t>(options_.max_rows));
    rows.clear();
    for (size_t i = begin; i < end; ++i) {
      rows.push_back({sequence, tokens[i], start_pos + static_cast<int32_t>(i), exit_threshold});
    }
    results.assign(rows.size(), {});
    ESTUARY_RETURN_IF_ERROR(Step(rows, absl::MakeSpan(results)));
    last = results.back();
  }
  return absl::OkStatus();
}

}  // namespace estuary::cuda
