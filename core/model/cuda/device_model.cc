#include "core/model/cuda/device_model.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/tensor/tensor.h"

namespace estuary::cuda {
namespace {

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, const char* what) {
  return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                    absl::StrCat("upload of ", what));
}

// Uploads a dense [out][in] matrix, padded with zeros to [padded_out][padded_in].
absl::StatusOr<DeviceDense> UploadDense(const Tensor& weight, int64_t padded_out, int64_t padded_in,
                                        const char* what) {
  if (weight.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a matrix, got ", weight.DebugString()));
  }
  const int64_t out = weight.dim(0), in = weight.dim(1);
  if (padded_out < out || padded_in < in) {
    return absl::InternalError(absl::StrCat(what, ": padding below the matrix size"));
  }
  const size_t element = DTypeBytes(weight.dtype(), 1);
  DeviceDense dense;
  dense.dtype = weight.dtype();
  dense.out_features = padded_out;
  dense.in_features = padded_in;
  ESTUARY_ASSIGN_OR_RETURN(
      dense.memory,
      DeviceArray<uint8_t>::Create(static_cast<size_t>(padded_out * padded_in) * element));
  const auto* src = static_cast<const uint8_t*>(weight.raw());
  if (padded_in == in) {
    ESTUARY_RETURN_IF_ERROR(CopyToDevice(dense.memory.get(), src, weight.nbytes(), what));
    return dense;
  }
  // Rows of different widths: one strided copy (the pad columns stay zero).
  ESTUARY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy2D(dense.memory.get(), static_cast<size_t>(padded_in) * element, src,
                              static_cast<size_t>(in) * element, static_cast<size_t>(in) * element,
                              static_cast<size_t>(out), cudaMemcpyHostToDevice),
                 absl::StrCat("upload of ", what)));
  return dense;
}

absl::StatusOr<DeviceArray<float>> UploadF32(const Tensor& tensor, const char* what) {
  ESTUARY_ASSIGN_OR_RETURN(Tensor f32, ConvertDType(tensor, DType::kF32));
  ESTUARY_ASSIGN_OR_RETURN(auto array,
                           DeviceArray<float>::Create(static_cast<size_t>(f32.numel())));
  ESTUARY_RETURN_IF_ERROR(CopyToDevice(array.get(), f32.raw(), f32.nbytes(), what));
  return array;
}

absl::StatusOr<Int4GpuMatrix> UploadInt4(const Int4Matrix& matrix) {
  ESTUARY_ASSIGN_OR_RETURN(Int4GpuHost host, PackInt4ForGpu(matrix));
  return Int4GpuMatrix::Upload(host);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Create(const LlamaModel& model,
                                                                 const River* river) {
  const LlamaConfig& c = model.config();
  if (model.tensor_parallel().size != 1 || model.row_parallel_blocks() != 1) {
    return absl::FailedPreconditionError(
        "the device decode path runs one tensor-parallel rank with unblocked o/down projections");
  }
  if (model.resident_layers() != c.n_layers) {
    return absl::FailedPreconditionError(
        "the device decode path needs every backbone layer resident");
  }
  if (river != nullptr && c.hidden_dim % 32 != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the int4 GPU kernel needs the MLP width to be a multiple of 32; this model has ",
        c.hidden_dim));
  }
  auto device = std::unique_ptr<DeviceModel>(new DeviceModel());
  device->config_ = c;
  device->padded_hidden_ = RoundUp(c.hidden_dim, 32);
  const int64_t hidden = device->padded_hidden_;
  const LlamaWeights& w = model.weights();

  device->backbone_.resize(static_cast<size_t>(c.n_layers));
  device->norms_.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const LlamaLayerWeights& lw = w.layers[static_cast<size_t>(l)];
    DeviceLayerDense& d = device->backbone_[static_cast<size_t>(l)];
    ESTUARY_ASSIGN_OR_RETURN(d.wq, UploadDense(lw.wq, lw.wq.dim(0), lw.wq.dim(1), "wq"));
    ESTUARY_ASSIGN_OR_RETURN(d.wk, UploadDense(lw.wk, lw.wk.dim(0), lw.wk.dim(1), "wk"));
    ESTUARY_ASSIGN_OR_RETURN(d.wv, UploadDense(lw.wv, lw.wv.dim(0), lw.wv.dim(1), "wv"));
    ESTUARY_ASSIGN_OR_RETURN(d.wo, UploadDense(lw.wo, lw.wo.dim(0), lw.wo.dim(1), "wo"));
    ESTUARY_ASSIGN_OR_RETURN(d.w_gate, UploadDense(lw.w_gate, hidden, c.dim, "w_gate"));
    ESTUARY_ASSIGN_OR_RETURN(d.w_up, UploadDense(lw.w_up, hidden, c.dim, "w_up"));
    ESTUARY_ASSIGN_OR_RETURN(d.w_down, UploadDense(lw.w_down, c.dim, hidden, "w_down"));
    DeviceLayerNorms& n = device->norms_[static_cast<size_t>(l)];
    ESTUARY_ASSIGN_OR_RETURN(n.attn_norm, UploadF32(lw.attn_norm, "attn_norm"));
    ESTUARY_ASSIGN_OR_RETURN(n.ffn_norm, UploadF32(lw.ffn_norm, "ffn_norm"));
  }

  if (river != nullptr) {
    device->has_river_ = true;
    device->river_first_layer_ = river->first_layer();
    for (int l = river->first_layer(); l < c.n_layers; ++l) {
      DeviceLayerInt4 layer;
      ESTUARY_ASSIGN_OR_RETURN(layer.wq, UploadInt4(river->matrix(l, RiverProjection::kQ)));
      ESTUARY_ASSIGN_OR_RETURN(layer.wk, UploadInt4(river->matrix(l, RiverProjection::kK)));
      ESTUARY_ASSIGN_OR_RETURN(layer.wv, UploadInt4(river->matrix(l, RiverProjection::kV)));
      ESTUARY_ASSIGN_OR_RETURN(layer.wo, UploadInt4(river->matrix(l, RiverProjection::kO)));
      ESTUARY_ASSIGN_OR_RETURN(layer.w_gate, UploadInt4(river->matrix(l, RiverProjection::kGate)));
      ESTUARY_ASSIGN_OR_RETURN(layer.w_up, UploadInt4(river->matrix(l, RiverProjection::kUp)));
      ESTUARY_ASSIGN_OR_RETURN(layer.w_down, UploadInt4(river->matrix(l, RiverProjection::kDown)));
      device->river_.push_back(std::move(layer));
    }
  }

  ESTUARY_ASSIGN_OR_RETURN(device->embedding_, UploadDense(w.embedding, w.embedding.dim(0),
                                                           w.embedding.dim(1), "embedding"));
  // A tied head shares the embedding's storage on the host (model_loader.cc keeps it so), and so
  // it does on the device.
  device->tied_ = w.lm_head.raw() == w.embedding.raw() && w.lm_head.dtype() == w.embedding.dtype();
  if (!device->tied_) {
    ESTUARY_ASSIGN_OR_RETURN(device->lm_head_,
                             UploadDense(w.lm_head, w.lm_head.dim(0), w.lm_head.dim(1), "lm_head"));
  }
  ESTUARY_ASSIGN_OR_RETURN(device->final_norm_, UploadF32(w.final_norm, "final_norm"));
  const absl::Span<const float> inv_freq = model.rope_inv_freq();
  ESTUARY_ASSIGN_OR_RETURN(device->rope_inv_freq_, DeviceArray<float>::Create(inv_freq.size()));
  ESTUARY_RETURN_IF_ERROR(CopyToDevice(device->rope_inv_freq_.get(), inv_freq.data(),
                                       inv_freq.size() * sizeof(float), "rope_inv_freq"));
  return device;
}

int64_t DeviceModel::backbone_layer_bytes(int layer) const {
  const DeviceLayerDense& d = backbone_[static_cast<size_t>(layer)];
  int64_t bytes = 0;
  for (const DeviceDense* m : {&d.wq, &d.wk, &d.wv, &d.wo, &d.w_gate, &d.w_up, &d.w_down}) {
    bytes += static_cast<int64_t>(m->memory.size());
  }
  return bytes;
}

int64_t DeviceModel::river_layer_bytes(int layer) const {
  if (!river_has_layer(layer)) return 0;
  const DeviceLayerInt4& r = river(layer);
  int64_t bytes = 0;
  for (const Int4GpuMatrix* m : {&r.wq, &r.wk, &r.wv, &r.wo, &r.w_gate, &r.w_up, &r.w_down}) {
    bytes += m->device_bytes();
  }
  return bytes;
}

}  // namespace estuary::cuda
