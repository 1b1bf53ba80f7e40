#pragma once
// Helpers shared by the decode-step kernel tests (decode_step_kernels_test.cc and
// decode_step_fused_test.cc): random weights and their bytes, the CPU references of a product and
// of its error bound, the row_path masks and the rows and page table of a KV write; with the matmul-side test
// helpers they use as well (a test takes them all with `using namespace decode_step_test`).

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cuda/decode_step_kernels.h"
#include "core/kernels/cuda/matmul_test_util.h"
#include "core/tensor/half_float.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/testing/random_data.h"

namespace estuary::cuda::decode_step_test {

using ::estuary::testing::RandomVector;
using matmul_test::DeviceArray;
using matmul_test::HasCudaDevice;
using matmul_test::Int4Magnitudes;
using matmul_test::Int4ViewOfShape;
using matmul_test::QuantizeInt4;
using matmul_test::QuantizedInt4;

// What the rows a masked launch must not write hold, and how many mismatches a check reports.
inline constexpr float kSentinel = -12345.5f;
inline constexpr int kMaxReported = 10;

inline bool IsInvalid(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument;
}

// A rows × cols weight of `dtype` (f32, bf16 or f16) with values uniform in [-0.05, 0.05].
inline Tensor RandomWeights(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  return ::estuary::testing::MakeTensor(
      dtype, {rows, cols}, ::estuary::testing::RandomVector(rows * cols, seed, -0.05f, 0.05f));
}

// The raw bytes of a host tensor, for a DeviceArray<uint8_t>.
inline std::vector<uint8_t> Bytes(const Tensor& t) {
  const auto* bytes = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(bytes, bytes + t.nbytes());
}

inline std::vector<float> Abs(std::vector<float> v) {
  for (float& f : v) f = std::fabs(f);
  return v;
}

// W[o][i] of a host f32/bf16/f16 tensor, widened to f32.
inline std::vector<float> Widened(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype()) {
      case DType::kF32:
        out[i] = t.data<float>()[i];
        break;
      case DType::kBF16:
        out[i] = Bf16ToF32(t.data<uint16_t>()[i]);
        break;
      case DType::kF16:
        out[i] = F16ToF32(t.data<uint16_t>()[i]);
        break;
      case DType::kInt4:
        break;
    }
  }
  return out;
}

// y = W x with the CPU kernel, for W given as f32 values [rows][cols].
inline std::vector<float> CpuMatMul(const std::vector<float>& w, int64_t rows, int64_t cols,
                                    const std::vector<float>& x, int64_t n_tokens) {
  const Tensor t = ::estuary::testing::MakeTensor(DType::kF32, {rows, cols}, w);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));
  EXPECT_TRUE(kernels::cpu::MatMul(t, x.data(), n_tokens, y.data()).ok());
  return y;
}

// --- Row masks ------------------------------------------------------------------------------

// A row_path pattern and the path asked for. kNoMask passes row_path == nullptr. Each test lists
// the masks it runs.
enum class Pattern { kNoMask, kAllBackbone, kAllRiver, kAlternating, kMixedWithIdle };
struct MaskCase {
  Pattern pattern;
  int32_t want;
  const char* name;
};

inline std::vector<int32_t> RowPaths(Pattern pattern, int64_t n) {
  std::vector<int32_t> path(static_cast<size_t>(n), kRowBackbone);
  for (int64_t t = 0; t < n; ++t) {
    int32_t& p = path[static_cast<size_t>(t)];
    switch (pattern) {
      case Pattern::kNoMask:
      case Pattern::kAllBackbone:
        break;
      case Pattern::kAllRiver:
        p = kRowRiver;
        break;
      case Pattern::kAlternating:
        p = t % 2 == 0 ? kRowBackbone : kRowRiver;
        break;
      case Pattern::kMixedWithIdle:
        p = static_cast<int32_t>(t % 3) - 1;  // idle, backbone, river, ...
        break;
    }
  }
  return path;
}

// One step's row of a KV write: its position and the page id its page-table row holds for that
// position's block.
struct KvRow {
  int position;
  int32_t page;
};

// The kernels' page table ([rows][stride]) and positions for `rows`: random valid page ids (below
// num_pages, from `seed`) everywhere except the entry each row's position uses, which holds
// row.page. Padding rows (position < 0) get their (bad) id in the first entry: the kernel must
// not look at it.
struct KvRowTables {
  std::vector<int32_t> table;
  std::vector<int32_t> positions;
};

inline KvRowTables MakeKvRowTables(const std::vector<KvRow>& rows, int stride, int block_size,
                                   int64_t num_pages, uint32_t seed) {
  const auto n = static_cast<int64_t>(rows.size());
  std::mt19937 rng(seed);
  KvRowTables out;
  out.table.resize(static_cast<size_t>(n * stride));
  for (int32_t& id : out.table) id = static_cast<int32_t>(rng() % num_pages);
  out.positions.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const KvRow& row = rows[static_cast<size_t>(t)];
    out.positions[static_cast<size_t>(t)] = row.position;
    const int block = row.position < 0 ? 0 : row.position / block_size;
    if (block < stride) out.table[static_cast<size_t>(t * stride + block)] = row.page;
  }
  return out;
}

}  // namespace estuary::cuda::decode_step_test
