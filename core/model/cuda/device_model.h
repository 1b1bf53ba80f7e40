#pragma once
// DeviceModel: a LlamaModel's weights (and optionally its exit river) copied to one GPU, in the
// form the device decode step (device_decoder.h) reads them. Built once at load from the host
// model, which it does not keep; immutable afterwards.
//
// Dense projections keep the checkpoint's dtype (f32, bf16 or f16), so a bf16 checkpoint runs a
// bf16 backbone and an f32 one reproduces the CPU's f32 arithmetic up to summation order. Norm
// weights become f32. The MLP width is padded to a multiple of 32 with zero rows of gate/up and
// zero columns of down, which changes no output (silu(0) * 0 = 0) and gives the kernels aligned
// rows. River matrices are repacked for the int4 kernel (bit-exact codes, int4_matmul.h), which
// needs the unpadded MLP width to be a multiple of 32.
//
// Limits (FAILED_PRECONDITION at Create): one tensor-parallel rank only (tp size 1, no row-
// parallel blocks; multi-GPU TP is NCCL work not wired here yet), every backbone layer resident.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/backend/cuda/cuda_resources.h"
#include "core/kernels/cuda/int4_matmul.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"
#include "core/tensor/dtype.h"

namespace estuary::cuda {

// One dense [out][in] matrix on the device.
struct DeviceDense {
  DeviceArray<uint8_t> memory;
  DType dtype = DType::kF32;
  int64_t out_features = 0;
  int64_t in_features = 0;
};

// The seven projections of one layer on one path.
struct DeviceLayerDense {
  DeviceDense wq, wk, wv, wo, w_gate, w_up, w_down;
};
struct DeviceLayerInt4 {
  Int4GpuMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

struct DeviceLayerNorms {
  DeviceArray<float> attn_norm;  // [dim]
  DeviceArray<float> ffn_norm;   // [dim]
};

class DeviceModel {
 public:
  // Uploads `model` (and `river`, when given, which must come from the same model) to the current
  // device. RESOURCE_EXHAUSTED when the GPU's memory runs out; FAILED_PRECONDITION for the limits
  // above.
  static absl::StatusOr<std::unique_ptr<DeviceModel>> Create(const LlamaModel& model,
                                                             const River* river);

  const LlamaConfig& config() const { return config_; }
  // The MLP width the device buffers use (hidden_dim rounded up to 32).
  int64_t padded_hidden() const { return padded_hidden_; }
  const DeviceLayerDense& backbone(int layer) const { return backbone_[layer]; }
  const DeviceLayerNorms& norms(int layer) const { return norms_[layer]; }
  bool has_river() const { return has_river_; }
  bool river_has_layer(int layer) const {
    return has_river_ && layer >= river_first_layer_ && layer < config_.n_layers;
  }
  const DeviceLayerInt4& river(int layer) const { return river_[layer - river_first_layer_]; }
  const DeviceDense& embedding() const { return embedding_; }
  // The embedding itself when the checkpoint ties them (same [vocab][dim] layout, read-only).
  const DeviceDense& lm_head() const { return tied_ ? embedding_ : lm_head_; }
  const DeviceArray<float>& final_norm() const { return final_norm_; }
  const DeviceArray<float>& rope_inv_freq() const { return rope_inv_freq_; }
  // Bytes of weights on the device: backbone projections, river, embedding, LM head.
  int64_t backbone_layer_bytes(int layer) const;
  int64_t river_layer_bytes(int layer) const;
  int64_t lm_head_bytes() const { return static_cast<int64_t>(lm_head().memory.size()); }

 private:
  DeviceModel() = default;

  LlamaConfig config_;
  int64_t padded_hidden_ = 0;
  std::vector<DeviceLayerDense> backbone_;
  std::vector<DeviceLayerNorms> norms_;
  bool has_river_ = false;
  int river_first_layer_ = 0;
  std::vector<DeviceLayerInt4> river_;
  DeviceDense embedding_;
  bool tied_ = false;    // the LM head is the embedding (one upload, one copy in memory)
  DeviceDense lm_head_;  // empty when tied
  DeviceArray<float> final_norm_;
  DeviceArray<float> rope_inv_freq_;
};

}  // namespace estuary::cuda
