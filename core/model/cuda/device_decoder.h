#pragma once
// DeviceDecoder: the forward pass on one GPU, for decode steps and short prefill chunks, with the
// exit river (design §5) decided on the device.
//
// A step is a list of rows; each row is one token of one sequence at one position. Rows of the
// same sequence must be consecutive and in position order (a prefill chunk); a decode step has
// one row per sequence. Every row's K/V is written before any row attends, and row t attends
// positions [0, position_t], so a chunk is causal without a mask.
//
// Per layer the seven projections run twice, once with the dense backbone weights for rows on
// the backbone and once with the int4 river weights for rows that have exited; each kernel reads
// the rows' paths on the device and a kernel whose path no row takes returns before reading its
// weights. Norms, RoPE, the KV write and attention run once for all rows. After each backbone
// layer the exit kernel compares cos(h_in, h_out) with each row's threshold under the policy's
// rule and moves rows to the river. So the host never waits inside a step, and a step is
// captured once per row-count bucket (powers of two up to max_rows) as a CUDA graph and replayed;
// rows beyond the real count are idle padding.
//
// KV lives in a KvPool whose layer regions are device memory (the CPU KvPool's page layout,
// f32); the decoder owns the pool and each sequence's pages. The outputs per row are the greedy
// next token (argmax of the logits), the backbone layers the row ran, and optionally the logits.
//
// Thread-compatible: one thread drives a decoder at a time.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/backend/cuda/cuda_resources.h"
#include "core/kernels/cuda/matmul.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/cuda/device_model.h"
#include "core/model/exit_policy.h"

namespace estuary::cuda {

struct DeviceDecoderOptions {
  int max_rows = 64;  // most rows in one step; graph buckets 1, 2, 4, ... max_rows
  int64_t kv_cache_bytes = int64_t{1} << 30;  // device memory for the KV pool
  int block_size = 16;                        // token slots per page
  int max_seq_len = 0;                        // longest sequence; 0: min(model context, 8192)
  ExitPolicy policy;                          // used when the model has a river
  bool use_graphs = true;  // false: launch the kernels directly every step (for tests)
  // false: no row ever leaves the backbone (thresholds and the river are ignored). Then bf16
  // projections of steps with at least kCublasMinRows rows run as cuBLAS GEMMs (activations
  // rounded to bf16), the fast path for prefill chunks.
  bool exits = true;
  // A pool to share instead of owning one (kv_cache_bytes is then unused): made with
  // DeviceKvRegionAllocator() and this model's layout at `block_size`. Two decoders with
  // different policies (prefill, decode) can serve one set of sequences this way. Must outlive
  // the decoder.
  KvPool* shared_pool = nullptr;
};

// Zeroed device memory for KvPool layer regions (freed with the pool), on the current device.
KvRegionAllocator DeviceKvRegionAllocator();

struct DeviceRow {
  int32_t sequence = 0;         // a handle from AddSequence
  int32_t token = 0;            // id inside the vocabulary
  int32_t position = 0;         // 0 .. max_seq_len - 1
  float exit_threshold = 2.0f;  // τ of the row's request; above 1 never exits
};

// A row of a step whose KV lives in a SequenceKv over pool(): what engines that manage their own
// sequences (the decode engine) pass to Run.
// Rows from which a step without exits runs its bf16 projections on cuBLAS.
inline constexpr int kCublasMinRows = 32;

struct DeviceStepRow {
  const SequenceKv* kv = nullptr;  // pages must already cover `position` (SequenceKv::Reserve)
  int32_t token = 0;
  int32_t position = 0;
  float exit_threshold = 2.0f;
  bool want_logits = false;  // Run's `logits` gets this row's vocab floats
};

struct DeviceRowResult {
  int32_t next_token = 0;       // argmax of the row's logits
  int32_t backbone_layers = 0;  // layers the row ran on the backbone
};

class DeviceDecoder {
 public:
  // Uses the current CUDA device. `model` must outlive the decoder.
  static absl::StatusOr<std::unique_ptr<DeviceDecoder>> Create(const DeviceModel& model,
                                                               const DeviceDecoderOptions& options);
  ~DeviceDecoder();

  // A new, empty sequence. Its pages are allocated as positions are written.
  absl::StatusOr<int32_t> AddSequence();
  // Returns the sequence's pages to the pool. Unknown handles are ignored.
  void ReleaseSequence(int32_t sequence);

  // Runs one step over sequences made by AddSequence, reserving the pages their positions need.
  // `results` has one element per row; `logits`, when not empty, receives rows.size() * vocab
  // floats. INVALID_ARGUMENT for an unknown sequence, a token outside the vocabulary, a position
  // out of range or out of order, or too many rows; RESOURCE_EXHAUSTED when the KV pool has no
  // page left; INTERNAL for a device error.
  absl::Status Step(absl::Span<const DeviceRow> rows, absl::Span<DeviceRowResult> results,
                    absl::Span<float> logits = {});
  // The same over sequences the caller owns (SequenceKv over pool(), pages already reserved).
  // `logits` receives vocab floats for each row with want_logits, in row order (only those rows
  // are downloaded). `on_layer_done(layer)`, when set, is called on this thread as soon as the
  // device has written the KV of `layer` for every row (an event recorded after each layer), in
  // layer order, while later layers still run: a KV push can start from there.
  absl::Status Run(absl::Span<const DeviceStepRow> rows, absl::Span<DeviceRowResult> results,
                   absl::Span<float> logits = {},
                   const std::function<void(int layer)>& on_layer_done = nullptr);

  // Writes `tokens` of one sequence at positions start_pos.. in chunks of max_rows rows (a
  // prefill); `last` receives the result of the last token.
  absl::Status Prefill(int32_t sequence, absl::Span<const int32_t> tokens, int start_pos,
                       float exit_threshold, DeviceRowResult& last);

  cudaStream_t stream() const { return stream_.get(); }
  const DeviceModel& model() const { return model_; }
  int max_seq_len() const { return max_seq_len_; }
  int32_t free_pages() const { return pool_->free_pages(); }
  int max_rows() const { return options_.max_rows; }
  // Nodes of the graph captured for `rows` rows (0 before its first step, or without graphs).
  size_t graph_nodes(int rows) const {
    auto it = graph_nodes_.find(BucketFor(rows));
    return it == graph_nodes_.end() ? 0 : it->second;
  }
  // The device KV pool: its page bookkeeping is on the host, its layer regions on the GPU.
  KvPool& pool() { return *pool_; }

 private:
  struct Buffers;  // device activations and per-step inputs (device_decoder.cc)

  DeviceDecoder(const DeviceModel& model, const DeviceDecoderOptions& options);
  absl::Status Init();
  // Checks the rows of a step (sizes, ids, positions, order; pages once reserved).
  absl::Status CheckRows(absl::Span<const DeviceStepRow> rows, bool pages_reserved) const;
  // Enqueues the whole step for `bucket` rows on the stream (what a graph captures).
  absl::Status EnqueueForward(int bucket);
  absl::Status EnqueueLayer(int layer, int bucket);
  int BucketFor(int rows) const;

  const DeviceModel& model_;
  DeviceDecoderOptions options_;
  int max_seq_len_ = 0;
  int pages_per_seq_ = 0;
  int forced_exit_ = 0;  // backbone layers after which every row is on the river
  StreamHandle stream_;
  std::optional<CublasHandle> cublas_;  // exits == false with bf16 weights only
  std::unique_ptr<KvPool> owned_pool_;
  KvPool* pool_ = nullptr;  // owned_pool_ or options_.shared_pool
  std::unique_ptr<Buffers> buffers_;
  std::vector<EventHandle> layer_done_;      // recorded after each layer (captured in the graphs)
  std::map<int, GraphExecHandle> graphs_;    // by bucket
  std::map<int, size_t> graph_nodes_;        // by bucket, for profiling
  std::map<int32_t, SequenceKv> sequences_;  // AddSequence handles
  int32_t next_sequence_ = 0;
};

}  // namespace estuary::cuda
