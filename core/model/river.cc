#include "core/model/river.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/model/tensor_parallel.h"

namespace estuary {

namespace {

// `weight` quantized as `blocks` column blocks of equal width.
absl::StatusOr<std::vector<Int4Matrix>> QuantizeColumnBlocks(const Tensor& weight, int blocks,
                                                             const Int4QuantOptions& options) {
  std::vector<Int4Matrix> out;
  if (blocks == 1) {
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix m, Int4Matrix::Quantize(weight, options));
    out.push_back(std::move(m));
    return out;
  }
  const int64_t width = weight.dim(1) / blocks;
  for (int b = 0; b < blocks; ++b) {
    ESTUARY_ASSIGN_OR_RETURN(Tensor block, CopyColumns(weight, b * width, (b + 1) * width));
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix m, Int4Matrix::Quantize(block, options));
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<River>> River::Build(
    const LlamaWeights& weights, const Int4QuantOptions& options, int first_layer,
    int row_parallel_blocks, RiverLmHead lm_head,
    std::shared_ptr<const Int4Matrix> quantized_lm_head) {
  const int n_layers = static_cast<int>(weights.layers.size());
  if (first_layer < 0 || first_layer > n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("river first layer ", first_layer, " outside [0, ", n_layers, "]"));
  }
  if (row_parallel_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("river row-parallel blocks ", row_parallel_blocks, " must be >= 1"));
  }
  const bool head_given = quantized_lm_head != nullptr;
  if (head_given &&
      (lm_head != RiverLmHead::kInt4 || quantized_lm_head->rows() != weights.lm_head.dim(0) ||
       quantized_lm_head->cols() != weights.lm_head.dim(1))) {
    return absl::InvalidArgumentError(
        "a quantized LM head was given for a river without one, or of another shape");
  }
  const absl::Time start = absl::Now();
  std::unique_ptr<River> river(new River(options, first_layer));
  for (int l = first_layer; l < n_layers; ++l) {
    const LlamaLayerWeights& w = weights.layers[static_cast<size_t>(l)];
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix wq, Int4Matrix::Quantize(w.wq, options));
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix wk, Int4Matrix::Quantize(w.wk, options));
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix wv, Int4Matrix::Quantize(w.wv, options));
    ESTUARY_ASSIGN_OR_RETURN(std::vector<Int4Matrix> wo,
                             QuantizeColumnBlocks(w.wo, row_parallel_blocks, options));
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix w_gate, Int4Matrix::Quantize(w.w_gate, options));
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix w_up, Int4Matrix::Quantize(w.w_up, options));
    ESTUARY_ASSIGN_OR_RETURN(std::vector<Int4Matrix> w_down,
                             QuantizeColumnBlocks(w.w_down, row_parallel_blocks, options));
    river->layers_.push_back(Layer{std::move(wq), std::move(wk), std::move(wv), std::move(w_gate),
                                   std::move(w_up), std::move(wo), std::move(w_down)});
  }
  if (head_given) {
    river->lm_head_ = std::move(quantized_lm_head);
  } else if (lm_head == RiverLmHead::kInt4) {
    ESTUARY_ASSIGN_OR_RETURN(Int4Matrix head, Int4Matrix::Quantize(weights.lm_head, options));
    river->lm_head_ = std::make_shared<const Int4Matrix>(std::move(head));
  }
  ESTUARY_LOG(INFO) << "exit river: " << (n_layers - first_layer) << " layers"
                    << (river->lm_head_ != nullptr && !head_given ? " and the LM head" : "")
                    << " quantized to int4 (group " << options.group_size
                    << (options.refine ? ", refined" : ", RTN") << ") in "
                    << absl::ToDoubleSeconds(absl::Now() - start) << " s, " << river->bytes()
                    << " bytes" << (head_given ? " (its LM head shared with another rank's)" : "");
  return river;
}

LayerProjections River::projections(int layer) const {
  const Layer& l = layers_[static_cast<size_t>(layer - first_layer_)];
  return LayerProjections{Linear::Int4(l.wq),         Linear::Int4(l.wk),
                          Linear::Int4(l.wv),         Linear::Int4Blocks(l.wo),
                          Linear::Int4(l.w_gate),     Linear::Int4(l.w_up),
                          Linear::Int4Blocks(l.w_down)};
}

const Int4Matrix& River::matrix(int layer, RiverProjection which) const {
  const Layer& l = layers_[static_cast<size_t>(layer - first_layer_)];
  switch (which) {
    case RiverProjection::kQ:
      return l.wq;
    case RiverProjection::kK:
      return l.wk;
    case RiverProjection::kV:
      return l.wv;
    case RiverProjection::kO:
      return l.wo[0];
    case RiverProjection::kGate:
      return l.w_gate;
    case RiverProjection::kUp:
      return l.w_up;
    case RiverProjection::kDown:
      return l.w_down[0];
  }
  return l.wq;
}

int64_t River::bytes() const {
  int64_t total = 0;
  for (int l = first_layer_; l < n_layers(); ++l) total += layer_bytes(l);
  if (lm_head_ != nullptr) total += lm_head_->bytes();
  return total;
}

}  // namespace estuary
