#include "core/tensor/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/tensor/half_float.h"

namespace estuary {

absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape, int64_t max_elements) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (d != 0 && numel > max_elements / d) {
      return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(shape, ", "),
                                                     "] has more than ", max_elements,
                                                     " elements"));
    }
    numel *= d;
  }
  return numel;
}

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, Shape shape) {
  auto numel = CheckedNumel(shape);
  if (!numel.ok()) return numel.status();
  const size_t bytes = DTypeBytes(dtype, static_cast<size_t>(*numel));
  auto buffer = std::make_shared<Buffer>(Buffer::AllocateHost(bytes));
  if (buffer->empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return View(std::move(buffer), 0, dtype, std::move(shape));
}

absl::StatusOr<Tensor> Tensor::HostCopyOf(const void* data, DType dtype, Shape shape) {
  auto numel = CheckedNumel(shape);
  if (!numel.ok()) return numel.status();
  const size_t bytes = DTypeBytes(dtype, static_cast<size_t>(*numel));
  auto buffer = std::make_shared<Buffer>(Buffer::CopyToHost(data, bytes));
  if (buffer->empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return View(std::move(buffer), 0, dtype, std::move(shape));
}

absl::StatusOr<Tensor> Tensor::View(std::shared_ptr<Buffer> storage, size_t byte_offset,
                                    DType dtype, Shape shape) {
  auto numel = CheckedNumel(shape);
  if (!numel.ok()) return numel.status();
  const size_t bytes = DTypeBytes(dtype, static_cast<size_t>(*numel));
  if (storage == nullptr || byte_offset > storage->size() ||
      bytes > storage->size() - byte_offset) {
    return absl::OutOfRangeError(absl::StrCat("view of ", bytes, " bytes at offset ", byte_offset,
                                              " does not fit a buffer of ",
                                              storage ? storage->size() : 0, " bytes"));
  }
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = byte_offset;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = *numel;
  return t;
}

absl::StatusOr<Tensor> Tensor::Rows(int64_t begin, int64_t end) const {
  if (rank() < 1 || begin < 0 || end < begin || end > dim(0) || dtype_ == DType::kInt4) {
    return absl::OutOfRangeError(
        absl::StrCat("rows [", begin, ", ", end, ") of ", DebugString()));
  }
  const int64_t row_elems = dim(0) == 0 ? 0 : numel_ / dim(0);
  Shape shape = shape_;
  shape[0] = end - begin;
  return View(storage_, offset_ + DTypeBytes(dtype_, static_cast<size_t>(begin * row_elems)),
              dtype_, std::move(shape));
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), "[", absl::StrJoin(shape_, ", "), "] on ",
                      device().ToString());
}

float ElementAsF32(const Tensor& tensor, int64_t i) {
  switch (tensor.dtype()) {
    case DType::kF32:
      return tensor.data<float>()[i];
    case DType::kBF16:
      return Bf16ToF32(tensor.data<uint16_t>()[i]);
    case DType::kF16:
      return F16ToF32(tensor.data<uint16_t>()[i]);
    case DType::kInt4:
      break;
  }
  return 0.0f;
}

absl::StatusOr<Tensor> ConvertDType(const Tensor& tensor, DType to) {
  if (!tensor.device().is_cpu()) {
    return absl::UnimplementedError("ConvertDType runs on host tensors only");
  }
  if (tensor.dtype() == DType::kInt4 || to == DType::kInt4) {
    return absl::InvalidArgumentError("int4 conversion goes through the quantizer");
  }
  auto out = Tensor::Zeros(to, tensor.shape());
  if (!out.ok()) return out.status();
  const int64_t n = tensor.numel();
  switch (to) {
    case DType::kF32: {
      float* dst = out->mutable_data<float>();
      for (int64_t i = 0; i < n; ++i) dst[i] = ElementAsF32(tensor, i);
      break;
    }
    case DType::kBF16: {
      uint16_t* dst = out->mutable_data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = F32ToBf16(ElementAsF32(tensor, i));
      break;
    }
    case DType::kF16: {
      uint16_t* dst = out->mutable_data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = F32ToF16(ElementAsF32(tensor, i));
      break;
    }
    case DType::kInt4:
      break;
  }
  return out;
}

}  // namespace estuary
