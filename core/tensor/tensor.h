#pragma once
// Tensor: a typed, shaped, contiguous (row-major) view into a shared Buffer.
//
// Ownership: tensors share their storage (std::shared_ptr<Buffer>), so slicing a weight out of a
// memory-mapped checkpoint or handing the same embedding to the LM head copies nothing. Tensors
// are not thread-safe for concurrent writes; weights are written once at load and then only read.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/backend/buffer.h"
#include "core/tensor/dtype.h"

namespace estuary {

using Shape = std::vector<int64_t>;

// Number of elements, or an error when a dimension is negative or the product overflows
// `max_elements`.
absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape,
                                     int64_t max_elements = int64_t{1} << 50);

class Tensor {
 public:
  Tensor() = default;

  // Zero-filled host tensor. RESOURCE_EXHAUSTED when memory cannot be had.
  static absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape);
  // A host tensor of `dtype` and `shape` in its own memory (Buffer::CopyToHost), holding a copy of
  // the bytes at `data` (as many as the shape needs). RESOURCE_EXHAUSTED when memory cannot be
  // had.
  static absl::StatusOr<Tensor> HostCopyOf(const void* data, DType dtype, Shape shape);
  // A view of `storage` from `byte_offset`; fails when the view would not fit.
  static absl::StatusOr<Tensor> View(std::shared_ptr<Buffer> storage, size_t byte_offset,
                                     DType dtype, Shape shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i)]; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return DTypeBytes(dtype_, static_cast<size_t>(numel_)); }
  Device device() const { return storage_ ? storage_->device() : Device::Cpu(); }
  // True when the tensor is a view of a memory-mapped file (a weight served from its checkpoint).
  bool in_file_mapping() const {
    return storage_ != nullptr && storage_->memory_kind() == MemoryKind::kMappedFile;
  }

  const void* raw() const { return static_cast<const uint8_t*>(storage_->data()) + offset_; }
  void* mutable_raw() { return static_cast<uint8_t*>(storage_->data()) + offset_; }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(raw());
  }
  template <typename T>
  T* mutable_data() {
    return static_cast<T*>(mutable_raw());
  }

  // Rows [begin, end) of the first dimension, sharing storage. Not for int4.
  absl::StatusOr<Tensor> Rows(int64_t begin, int64_t end) const;

  std::string DebugString() const;  // "bf16[2048, 8192] on cpu"

 private:
  std::shared_ptr<Buffer> storage_;
  size_t offset_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t numel_ = 0;
};

// Element-wise conversion between f32, bf16 and f16 on the host (a copy; same shape).
absl::StatusOr<Tensor> ConvertDType(const Tensor& tensor, DType to);

// Reads element `i` of an f32/bf16/f16 host tensor as f32 (reference code and tests).
float ElementAsF32(const Tensor& tensor, int64_t i);

}  // namespace estuary
