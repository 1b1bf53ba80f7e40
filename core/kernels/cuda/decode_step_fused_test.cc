// Tests of the fused decode-step launches of decode_step_kernels.h (DenseMatMulRowsMulti,
// Int4MatMulRowsMulti, DenseMatMulRowsSwiGlu, Int4MatMulRowsSwiGlu, RopeWriteKvRows), CTest label
// `gpu`. FusedArgsTest.* need no device (arguments are rejected on the host, or the launch fails
// without one) and pass on the CPU; every other test skips itself with "no CUDA device".
//
// What is checked (every comparison between GPU results is bitwise, on the whole output buffer,
// sentinel rows included):
//   Multi:   one fused launch == one DenseMatMulRows / Int4MatMulRows per segment, under every
//            row mask; plus the unmasked dense result vs kernels::cpu::MatMul (the
//            decode_step_kernels_test bound 2e-5 · Σ|x·w| + 1e-6).
//   SwiGlu:  the SwiGLU-on-load product == SwiGlu (elementwise.h) + the plain product, under
//            every mask; and vs the CPU (cpu::SwiGlu then MatMul): dense 2e-5 · Σ|h·w| + 1e-6,
//            int4 2e-5 · Σ|h| (|s| q + |m|) + 1e-6, with h = silu(gate) · up on the CPU.
//   RoPE+KV: RopeWriteKvRows == ApplyRope + WriteKvRows (q, k, the page region and the error
//            flag) on every non-padding row; padding rows' q and k keep their input bits.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cuda/decode_step_kernels.h"
#include "core/kernels/cuda/decode_step_test_util.h"
#include "core/kernels/cuda/elementwise.h"
#include "core/kernels/cuda/elementwise_test_util.h"
#include "core/kernels/cuda/int4_matmul.h"
#include "core/kernels/cuda/matmul_test_util.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/testing/random_data.h"

namespace estuary::cuda {
namespace {

using namespace decode_step_test;  // NOLINT(build/namespaces): the tests' shared helpers

// The bits of each float, so that comparisons are bitwise (NaN and -0 included).
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

// Reports up to kMaxReported differing elements of two equally sized float arrays (bitwise).
void ExpectBitwiseEqual(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const std::vector<uint32_t> a = Bits(got);
  const std::vector<uint32_t> b = Bits(want);
  int failures = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i] && ++failures <= kMaxReported) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// Checks |got - ref| <= 2e-5 · bound + 1e-6 element-wise.
void ExpectWithinBound(const std::vector<float>& got, const std::vector<float>& ref,
                       const std::vector<float>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= 2e-5 * bound[i] + 1e-6) && ++failures <= kMaxReported) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " ref " << ref[i] << " bound "
                    << bound[i];
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// --- Row masks ------------------------------------------------------------------------------

constexpr MaskCase kMasks[] = {
    {Pattern::kNoMask, kRowBackbone, "no mask"},
    {Pattern::kAllRiver, kRowBackbone, "no row"},
    {Pattern::kAlternating, kRowBackbone, "alternating, backbone"},
    {Pattern::kAlternating, kRowRiver, "alternating, river"},
    {Pattern::kMixedWithIdle, kRowRiver, "idle/backbone/river, river"},
};

// Sentinel-filled device outputs, one per segment, of n_tokens × outs[s] floats.
struct Outputs {
  std::vector<std::unique_ptr<DeviceArray<float>>> y;
  Outputs(int64_t n_tokens, const std::vector<int64_t>& outs) {
    for (int64_t out : outs) {
      y.push_back(std::make_unique<DeviceArray<float>>(
          std::vector<float>(static_cast<size_t>(n_tokens * out), kSentinel)));
    }
  }
  float* get(size_t s) const { return y[s]->get(); }
  std::vector<float> Download(size_t s) const { return y[s]->Download(); }
};

// For every mask: `fused(row_path, want, ys)` and `separate(s, row_path, want, y_s)` for each
// segment s on fresh sentinel-filled outputs; the outputs must agree bitwise.
template <typename Fused, typename Separate>
void CheckFusedEqualsSeparate(int64_t n_tokens, const std::vector<int64_t>& outs, Fused fused,
                              Separate separate) {
  for (const MaskCase& mask : kMasks) {
    SCOPED_TRACE(mask.name);
    DeviceArray<int32_t> d_path(RowPaths(mask.pattern, n_tokens));
    const int32_t* row_path = mask.pattern == Pattern::kNoMask ? nullptr : d_path.get();
    Outputs got(n_tokens, outs);
    Outputs want(n_tokens, outs);
    const absl::Status status = fused(row_path, mask.want, got);
    ASSERT_TRUE(status.ok()) << status;
    for (size_t s = 0; s < outs.size(); ++s) {
      const absl::Status one = separate(s, row_path, mask.want, want.get(s));
      ASSERT_TRUE(one.ok()) << one;
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t s = 0; s < outs.size(); ++s) {
      ExpectBitwiseEqual(got.Download(s), want.Download(s), absl::StrCat("segment ", s));
    }
  }
}

// --- DenseMatMulRowsMulti -------------------------------------------------------------------

struct MultiCase {
  std::vector<int64_t> outs;  // out_features (dense) or rows (int4) of each segment
  int64_t in = 0;
  int64_t n_tokens = 0;
  DType dtype = DType::kF32;  // dense only
  int group = 64;             // int4 only
};

std::string MultiName(const MultiCase& c, bool int4) {
  return absl::StrCat(absl::StrJoin(c.outs, "_"), "x", c.in, "_n", c.n_tokens, "_",
                      int4 ? absl::StrCat("g", c.group) : std::string(DTypeName(c.dtype)));
}

std::vector<MultiCase> DenseMultiCases() {
  // Llama-3.2-1B q/k/v (4, 8, 8 warps per row group: a block of 8 warps holds 2 q groups) and
  // gate/up; mixed warp counts (8192 rows: 1 warp, 4 or 12 rows: 8 warps); tiny odd shapes with
  // partial row groups; one segment (the DenseMatMulRows path itself).
  const std::pair<std::vector<int64_t>, int64_t> shapes[] = {
      {{2048, 512, 512}, 2048}, {{8192, 8192}, 2048}, {{5, 8192, 12}, 2048},
      {{3, 17, 70}, 520},       {{1, 6}, 40},         {{70}, 520},
      {{2048}, 8192}};
  std::vector<MultiCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [outs, in] : shapes) {
      for (int64_t n : {1, 3, 8, 32}) cases.push_back({outs, in, n, dtype, 0});
    }
  }
  return cases;
}

class DenseMultiTest : public ::testing::TestWithParam<MultiCase> {};

TEST_P(DenseMultiTest, EqualsOneDenseMatMulRowsPerSegment) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const MultiCase c = GetParam();
  const auto seed = static_cast<uint32_t>(c.in * 13 + c.n_tokens + c.outs.size());
  std::vector<Tensor> w;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> d_w;
  for (size_t s = 0; s < c.outs.size(); ++s) {
    w.push_back(RandomWeights(c.dtype, c.outs[s], c.in, seed + 7 * static_cast<uint32_t>(s)));
    d_w.push_back(std::make_unique<DeviceArray<uint8_t>>(Bytes(w.back())));
  }
  const std::vector<float> x = RandomVector(c.n_tokens * c.in, seed + 100);
  DeviceArray<float> d_x(x);
  CheckFusedEqualsSeparate(
      c.n_tokens, c.outs,
      [&](const int32_t* row_path, int32_t want, Outputs& out) {
        std::vector<DenseSegment> segments;
        for (size_t s = 0; s < c.outs.size(); ++s) {
          segments.push_back({d_w[s]->get(), c.outs[s], out.get(s)});
        }
        return DenseMatMulRowsMulti(segments, c.dtype, c.in, d_x.get(), c.n_tokens, row_path,
                                    want, nullptr);
      },
      [&](size_t s, const int32_t* row_path, int32_t want, float* y) {
        return DenseMatMulRows(d_w[s]->get(), c.dtype, c.outs[s], c.in, d_x.get(), c.n_tokens,
                               row_path, want, y, nullptr);
      });

  // The unmasked fused result against the CPU.
  Outputs got(c.n_tokens, c.outs);
  std::vector<DenseSegment> segments;
  for (size_t s = 0; s < c.outs.size(); ++s) {
    segments.push_back({d_w[s]->get(), c.outs[s], got.get(s)});
  }
  ASSERT_TRUE(DenseMatMulRowsMulti(segments, c.dtype, c.in, d_x.get(), c.n_tokens, nullptr,
                                   kRowBackbone, nullptr)
                  .ok());
  for (size_t s = 0; s < c.outs.size(); ++s) {
    std::vector<float> ref(static_cast<size_t>(c.n_tokens * c.outs[s]));
    ASSERT_TRUE(kernels::cpu::MatMul(w[s], x.data(), c.n_tokens, ref.data()).ok());
    ExpectWithinBound(got.Download(s), ref,
                      CpuMatMul(Abs(Widened(w[s])), c.outs[s], c.in, Abs(x), c.n_tokens),
                      absl::StrCat("segment ", s, " vs cpu"));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseMultiTest, ::testing::ValuesIn(DenseMultiCases()),
                         [](const ::testing::TestParamInfo<MultiCase>& info) {
                           return MultiName(info.param, /*int4=*/false);
                         });

// --- Int4MatMulRowsMulti --------------------------------------------------------------------

// An RTN-quantized random matrix on the host and on the device, with what the CPU reference
// needs: the dequantized weights and |s| q + |m| per element.
struct Int4Weights {
  std::vector<float> dequantized;  // [rows][cols]
  std::vector<float> magnitude;    // |s| q + |m|
  Int4GpuMatrix device;
};

Int4Weights MakeInt4(int64_t rows, int64_t cols, int group, uint32_t seed) {
  Int4Weights out;
  absl::StatusOr<QuantizedInt4> q =
      QuantizeInt4(RandomWeights(DType::kF32, rows, cols, seed), group);
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return out;
  out.dequantized = std::move(q->dequantized);
  out.magnitude = Int4Magnitudes(q->matrix);
  absl::StatusOr<Int4GpuMatrix> device = Int4GpuMatrix::Upload(q->host);
  EXPECT_TRUE(device.ok()) << device.status();
  if (device.ok()) out.device = std::move(*device);
  return out;
}

std::vector<MultiCase> Int4MultiCases() {
  // Llama-3.2-1B q/k/v at g128 and gate/up at g64; tiny segments with partial row blocks; one
  // segment (the Int4MatMulRows path itself).
  const std::tuple<std::vector<int64_t>, int64_t, int> shapes[] = {
      {{2048, 512, 512}, 2048, 128}, {{8192, 8192}, 2048, 64}, {{5, 33, 17}, 256, 64},
      {{5, 33, 17}, 256, 128},       {{17}, 384, 64}};
  std::vector<MultiCase> cases;
  for (const auto& [outs, cols, group] : shapes) {
    for (int64_t n : {1, 3, 8, 32}) cases.push_back({outs, cols, n, DType::kF32, group});
  }
  return cases;
}

class Int4MultiTest : public ::testing::TestWithParam<MultiCase> {};

TEST_P(Int4MultiTest, EqualsOneInt4MatMulRowsPerSegment) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const MultiCase c = GetParam();
  const auto seed = static_cast<uint32_t>(c.in * 5 + c.group + c.n_tokens);
  std::vector<Int4Weights> w;
  for (size_t s = 0; s < c.outs.size(); ++s) {
    w.push_back(MakeInt4(c.outs[s], c.in, c.group, seed + 11 * static_cast<uint32_t>(s)));
    ASSERT_EQ(w.back().device.view().rows, c.outs[s]);
  }
  DeviceArray<float> d_x(RandomVector(c.n_tokens * c.in, seed + 100));
  CheckFusedEqualsSeparate(
      c.n_tokens, c.outs,
      [&](const int32_t* row_path, int32_t want, Outputs& out) {
        std::vector<Int4Segment> segments;
        for (size_t s = 0; s < c.outs.size(); ++s) {
          segments.push_back({w[s].device.view(), out.get(s)});
        }
        return Int4MatMulRowsMulti(segments, d_x.get(), c.n_tokens, row_path, want, nullptr);
      },
      [&](size_t s, const int32_t* row_path, int32_t want, float* y) {
        return Int4MatMulRows(w[s].device.view(), d_x.get(), c.n_tokens, row_path, want, y,
                              nullptr);
      });
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int4MultiTest, ::testing::ValuesIn(Int4MultiCases()),
                         [](const ::testing::TestParamInfo<MultiCase>& info) {
                           return MultiName(info.param, /*int4=*/true);
                         });

// --- SwiGLU on load -------------------------------------------------------------------------

// gate and up for n_tokens × in, gate spread over [-6, 6] so that silu sees both tails.
struct SwiGluInputs {
  std::vector<float> gate;
  std::vector<float> up;
  std::vector<float> h_cpu;  // cpu::SwiGlu(gate, up)
};

SwiGluInputs MakeSwiGluInputs(int64_t n, uint32_t seed) {
  SwiGluInputs in;
  in.gate = RandomVector(n, seed, -6.0f, 6.0f);
  in.up = RandomVector(n, seed + 1);
  in.h_cpu.resize(static_cast<size_t>(n));
  kernels::cpu::SwiGlu(in.gate.data(), in.up.data(), n, in.h_cpu.data());
  return in;
}

struct SwiGluCase {
  int64_t out = 0;
  int64_t in = 0;
  int64_t n_tokens = 0;
  DType dtype = DType::kF32;  // dense
  int group = 0;              // int4 (0: dense)
};

std::string SwiGluName(const ::testing::TestParamInfo<SwiGluCase>& info) {
  const SwiGluCase& c = info.param;
  return absl::StrCat(c.out, "x", c.in, "_n", c.n_tokens, "_",
                      c.group > 0 ? absl::StrCat("g", c.group)
                                  : std::string(DTypeName(c.dtype)));
}

std::vector<SwiGluCase> DenseSwiGluCases() {
  // Tiny, and Llama-3.2-1B's down projection (2048 × 8192).
  const std::pair<int64_t, int64_t> shapes[] = {{17, 40}, {70, 520}, {2048, 8192}};
  std::vector<SwiGluCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [out, in] : shapes) {
      for (int64_t n : {1, 3, 8, 32}) cases.push_back({out, in, n, dtype, 0});
    }
  }
  return cases;
}

class DenseSwiGluTest : public ::testing::TestWithParam<SwiGluCase> {};

TEST_P(DenseSwiGluTest, EqualsSwiGluThenDenseMatMulRows) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const SwiGluCase c = GetParam();
  const auto seed = static_cast<uint32_t>(c.out + c.in * 3 + c.n_tokens);
  const Tensor w = RandomWeights(c.dtype, c.out, c.in, seed);
  DeviceArray<uint8_t> d_w(Bytes(w));
  const SwiGluInputs in = MakeSwiGluInputs(c.n_tokens * c.in, seed + 1);
  DeviceArray<float> d_gate(in.gate), d_up(in.up);
  DeviceArray<float> d_h(in.gate.size());
  ASSERT_TRUE(SwiGlu(d_gate.get(), d_up.get(), c.n_tokens * c.in, d_h.get(), nullptr).ok());
  CheckFusedEqualsSeparate(
      c.n_tokens, {c.out},
      [&](const int32_t* row_path, int32_t want, Outputs& out) {
        return DenseMatMulRowsSwiGlu(d_w.get(), c.dtype, c.out, c.in, d_gate.get(), d_up.get(),
                                     c.n_tokens, row_path, want, out.get(0), nullptr);
      },
      [&](size_t, const int32_t* row_path, int32_t want, float* y) {
        return DenseMatMulRows(d_w.get(), c.dtype, c.out, c.in, d_h.get(), c.n_tokens, row_path,
                               want, y, nullptr);
      });

  DeviceArray<float> d_y(static_cast<size_t>(c.n_tokens * c.out));
  ASSERT_TRUE(DenseMatMulRowsSwiGlu(d_w.get(), c.dtype, c.out, c.in, d_gate.get(), d_up.get(),
                                    c.n_tokens, nullptr, kRowBackbone, d_y.get(), nullptr)
                  .ok());
  std::vector<float> ref(static_cast<size_t>(c.n_tokens * c.out));
  ASSERT_TRUE(kernels::cpu::MatMul(w, in.h_cpu.data(), c.n_tokens, ref.data()).ok());
  ExpectWithinBound(d_y.Download(), ref,
                    CpuMatMul(Abs(Widened(w)), c.out, c.in, Abs(in.h_cpu), c.n_tokens), "vs cpu");
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseSwiGluTest, ::testing::ValuesIn(DenseSwiGluCases()),
                         SwiGluName);

std::vector<SwiGluCase> Int4SwiGluCases() {
  const std::tuple<int64_t, int64_t, int> shapes[] = {
      {5, 64, 64}, {33, 256, 128}, {2048, 8192, 64}, {2048, 8192, 128}};
  std::vector<SwiGluCase> cases;
  for (auto [rows, cols, group] : shapes) {
    for (int64_t n : {1, 3, 8, 32}) cases.push_back({rows, cols, n, DType::kF32, group});
  }
  return cases;
}

class Int4SwiGluTest : public ::testing::TestWithParam<SwiGluCase> {};

TEST_P(Int4SwiGluTest, EqualsSwiGluThenInt4MatMulRows) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const SwiGluCase c = GetParam();
  const auto seed = static_cast<uint32_t>(c.out * 3 + c.in + c.group + c.n_tokens);
  const Int4Weights w = MakeInt4(c.out, c.in, c.group, seed);
  ASSERT_EQ(w.device.view().rows, c.out);
  const SwiGluInputs in = MakeSwiGluInputs(c.n_tokens * c.in, seed + 1);
  DeviceArray<float> d_gate(in.gate), d_up(in.up);
  DeviceArray<float> d_h(in.gate.size());
  ASSERT_TRUE(SwiGlu(d_gate.get(), d_up.get(), c.n_tokens * c.in, d_h.get(), nullptr).ok());
  CheckFusedEqualsSeparate(
      c.n_tokens, {c.out},
      [&](const int32_t* row_path, int32_t want, Outputs& out) {
        return Int4MatMulRowsSwiGlu(w.device.view(), d_gate.get(), d_up.get(), c.n_tokens,
                                    row_path, want, out.get(0), nullptr);
      },
      [&](size_t, const int32_t* row_path, int32_t want, float* y) {
        return Int4MatMulRows(w.device.view(), d_h.get(), c.n_tokens, row_path, want, y,
                              nullptr);
      });

  DeviceArray<float> d_y(static_cast<size_t>(c.n_tokens * c.out));
  ASSERT_TRUE(Int4MatMulRowsSwiGlu(w.device.view(), d_gate.get(), d_up.get(), c.n_tokens,
                                   nullptr, kRowBackbone, d_y.get(), nullptr)
                  .ok());
  ExpectWithinBound(d_y.Download(), CpuMatMul(w.dequantized, c.out, c.in, in.h_cpu, c.n_tokens),
                    CpuMatMul(w.magnitude, c.out, c.in, Abs(in.h_cpu), c.n_tokens), "vs cpu");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int4SwiGluTest, ::testing::ValuesIn(Int4SwiGluCases()),
                         SwiGluName);

// --- RopeWriteKvRows ------------------------------------------------------------------------

struct RopeKvCase {
  int n_q_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  bool llama3 = false;  // theta 500000 with Llama 3.2's scaling, else theta 10000 unscaled
  RopeStyle style = RopeStyle::kHalves;
};

std::string RopeKvName(const ::testing::TestParamInfo<RopeKvCase>& info) {
  const RopeKvCase& c = info.param;
  return absl::StrCat(c.style == RopeStyle::kInterleaved ? "interleaved" : "halves", "_q",
                      c.n_q_heads, "_kv", c.n_kv_heads, "_hd", c.head_dim, "_b", c.block_size,
                      c.llama3 ? "_llama3" : "");
}

// Runs RopeWriteKvRows and, on copies, ApplyRope + WriteKvRows, and compares everything.
void RunRopeKv(const RopeKvCase& c, const std::vector<KvRow>& rows, int stride, uint32_t seed) {
  constexpr int64_t kPages = 10;
  const PageShape shape{c.n_kv_heads, c.block_size, c.head_dim};
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t q_row = int64_t{c.n_q_heads} * c.head_dim;
  const int64_t kv_row = int64_t{c.n_kv_heads} * c.head_dim;
  // At least one float: DeviceArray copies one byte for an empty vector (no query heads).
  const std::vector<float> q = RandomVector(std::max<int64_t>(1, n * q_row), seed);
  const std::vector<float> k = RandomVector(n * kv_row, seed + 1);
  const std::vector<float> v = RandomVector(n * kv_row, seed + 2);
  const std::vector<float> region = RandomVector(kPages * shape.page_floats(), seed + 3);
  const auto [table, positions] = MakeKvRowTables(rows, stride, c.block_size, kPages, seed);
  const std::vector<float> inv_freq =
      elementwise_test::TestRopeInverseFrequencies(c.head_dim, c.llama3);
  DeviceArray<float> d_inv_freq(inv_freq), d_v(v);
  DeviceArray<int32_t> d_positions(positions), d_table(table);

  DeviceArray<float> d_q(q), d_k(k), d_region(region);
  DeviceArray<int32_t> d_flag(std::vector<int32_t>{0});
  ASSERT_TRUE(RopeWriteKvRows(d_q.get(), c.n_q_heads, d_k.get(), d_v.get(), c.n_kv_heads,
                              c.head_dim, d_positions.get(), n, d_inv_freq.get(), c.style,
                              d_table.get(), stride, d_region.get(), kPages, shape, d_flag.get(),
                              nullptr)
                  .ok());
  DeviceArray<float> r_q(q), r_k(k), r_region(region);
  DeviceArray<int32_t> r_flag(std::vector<int32_t>{0});
  ASSERT_TRUE(ApplyRope(r_q.get(), c.n_q_heads, r_k.get(), c.n_kv_heads, c.head_dim,
                        d_positions.get(), n, d_inv_freq.get(), c.style, nullptr)
                  .ok());
  ASSERT_TRUE(WriteKvRows(r_k.get(), d_v.get(), n, d_positions.get(), d_table.get(), stride,
                          r_region.get(), kPages, shape, r_flag.get(), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  ExpectBitwiseEqual(d_region.Download(), r_region.Download(), "page region");
  EXPECT_EQ(d_flag.Download(), r_flag.Download());
  // q and k: the reference's rows where the position is valid, the input's on padding rows.
  std::vector<float> want_q = r_q.Download();
  std::vector<float> want_k = r_k.Download();
  for (int64_t t = 0; t < n; ++t) {
    if (positions[static_cast<size_t>(t)] >= 0) continue;
    std::copy(q.begin() + t * q_row, q.begin() + (t + 1) * q_row, want_q.begin() + t * q_row);
    std::copy(k.begin() + t * kv_row, k.begin() + (t + 1) * kv_row, want_k.begin() + t * kv_row);
  }
  ExpectBitwiseEqual(d_q.Download(), want_q, "q");
  ExpectBitwiseEqual(d_k.Download(), want_k, "k");
}

class RopeWriteKvRowsTest : public ::testing::TestWithParam<RopeKvCase> {};

TEST_P(RopeWriteKvRowsTest, EqualsApplyRopeThenWriteKvRowsWithBadRows) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const int b = GetParam().block_size;
  ASSERT_GE(b, 3) << "the rows below need three slots per page";
  // Distinct (page, slot) targets for the valid rows (3 * b positions fit the 3-entry table).
  RunRopeKv(GetParam(),
            {{0, 3},          // first slot of the first block
             {b + 1, 0},      // second block, second slot
             {3 * b - 1, 9},  // last slot of the last block, last page
             {-1, -7},        // padding: left alone, its bad id never read
             {3 * b, 4},      // past the page table: flagged, still rotated
             {b - 1, 10},     // page id == num_pages: flagged
             {b, -1},         // negative page id: flagged
             {2 * b - 1, 3},  // same page as row 0, another slot
             {-5, 2},         // padding with a valid-looking id
             {1, 5}},
            /*stride=*/3, 17u);
}

TEST_P(RopeWriteKvRowsTest, EqualsApplyRopeThenWriteKvRowsAtLargePositions) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const int b = GetParam().block_size;
  // Positions up to 8999 (large angles for cosf / sinf): a table of 9100 / b + 1 entries.
  const int stride = 9100 / b + 1;
  RunRopeKv(GetParam(), {{8999, 1}, {-1, 0}, {1237, 2}, {4096, 3}, {2 * b + 1, 4}, {7000, 9}},
            stride, 29u);
}

std::vector<RopeKvCase> RopeKvCases() {
  std::vector<RopeKvCase> cases;
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalves}) {
    cases.push_back({32, 8, 64, 16, true, style});  // Llama-3.2-1B
    cases.push_back({2, 1, 8, 4, false, style});
    cases.push_back({3, 3, 10, 3, false, style});   // odd head counts, head_dim / 2 odd
    cases.push_back({0, 1, 2, 5, false, style});    // no query heads, one rotation pair
    cases.push_back({5, 1, 6, 7, false, style});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeWriteKvRowsTest, ::testing::ValuesIn(RopeKvCases()),
                         RopeKvName);

// --- Argument checks (no device needed) ----------------------------------------------------

// Host memory that is never dereferenced: every call below fails its checks before launching
// (or, in the last test, fails to launch without a device).
alignas(16) float fake_floats[64] = {};
alignas(16) int32_t fake_ints[64] = {};

TEST(FusedArgsTest, DenseMatMulRowsMultiRejectsBadArguments) {
  float* f = fake_floats;
  const int32_t* path = fake_ints;
  const DenseSegment ok{f, 4, f};
  const std::vector<DenseSegment> four(4, ok);
  const auto multi = [&](absl::Span<const DenseSegment> segments, DType dtype = DType::kBF16,
                         int64_t in = 8, const float* x = fake_floats, int64_t n_tokens = 1) {
    return DenseMatMulRowsMulti(segments, dtype, in, x, n_tokens, path, kRowBackbone, nullptr);
  };
  EXPECT_TRUE(IsInvalid(multi({})));
  EXPECT_TRUE(IsInvalid(multi(four)));
  EXPECT_TRUE(IsInvalid(multi({}, DType::kBF16, 8, f, /*n_tokens=*/0)));  // count before tokens
  EXPECT_TRUE(IsInvalid(multi({ok, ok}, DType::kInt4)));
  EXPECT_TRUE(IsInvalid(multi({ok, ok}, DType::kF32, /*in=*/12)));
  EXPECT_TRUE(IsInvalid(multi({ok, ok}, DType::kF32, /*in=*/0)));
  EXPECT_TRUE(IsInvalid(multi({ok, DenseSegment{f, 0, f}})));
  EXPECT_TRUE(IsInvalid(multi({ok, DenseSegment{f, (int64_t{1} << 30) + 1, f}})));
  EXPECT_TRUE(IsInvalid(multi({ok, ok, DenseSegment{nullptr, 4, f}})));
  EXPECT_TRUE(IsInvalid(multi({ok, DenseSegment{f, 4, nullptr}})));
  EXPECT_TRUE(IsInvalid(multi({ok, DenseSegment{f + 1, 4, f}})));  // misaligned w
  EXPECT_TRUE(IsInvalid(multi({ok}, DType::kF32, 8, nullptr)));
  EXPECT_TRUE(IsInvalid(multi({ok}, DType::kF32, 8, f + 2)));  // misaligned x
  EXPECT_TRUE(IsInvalid(multi({ok}, DType::kF32, 8, f, -1)));
  EXPECT_TRUE(IsInvalid(multi({ok}, DType::kF32, 8, f, int64_t{65535} * 8 + 1)));
  // No tokens: nothing to do, whatever the pointers.
  EXPECT_TRUE(multi({DenseSegment{nullptr, 4, nullptr}}, DType::kF16, 8, nullptr, 0).ok());
}

Int4GpuView FakeInt4View(int64_t rows, int64_t cols, int64_t group) {
  Int4GpuView w = Int4ViewOfShape(rows, cols, group);
  w.nibbles = fake_floats;
  w.scales = reinterpret_cast<const uint16_t*>(fake_ints);
  w.offsets = reinterpret_cast<const uint16_t*>(fake_ints);
  return w;
}

TEST(FusedArgsTest, Int4MatMulRowsMultiRejectsBadArguments) {
  float* f = fake_floats;
  const Int4Segment ok{FakeInt4View(4, 64, 64), f};
  const auto multi = [&](absl::Span<const Int4Segment> segments, const float* x = fake_floats,
                         int64_t n_tokens = 1) {
    return Int4MatMulRowsMulti(segments, x, n_tokens, fake_ints, kRowRiver, nullptr);
  };
  EXPECT_TRUE(IsInvalid(multi({})));
  EXPECT_TRUE(IsInvalid(multi(std::vector<Int4Segment>(4, ok))));
  EXPECT_TRUE(IsInvalid(multi({ok, Int4Segment{FakeInt4View(4, 128, 64), f}})));  // cols
  EXPECT_TRUE(IsInvalid(multi({ok, Int4Segment{FakeInt4View(4, 64, 32), f}})));   // group
  EXPECT_TRUE(IsInvalid(multi({Int4Segment{FakeInt4View(4, 72, 64), f}})));  // cols % 32
  Int4Segment bad_groups = ok;
  bad_groups.w.n_groups = 2;
  EXPECT_TRUE(IsInvalid(multi({ok, bad_groups})));
  Int4Segment no_nibbles = ok;
  no_nibbles.w.nibbles = nullptr;
  EXPECT_TRUE(IsInvalid(multi({ok, ok, no_nibbles})));
  Int4Segment no_scales = ok;
  no_scales.w.scales = nullptr;
  EXPECT_TRUE(IsInvalid(multi({no_scales})));
  EXPECT_TRUE(IsInvalid(multi({ok, Int4Segment{ok.w, nullptr}})));
  EXPECT_TRUE(IsInvalid(multi({ok}, nullptr)));
  EXPECT_TRUE(IsInvalid(multi({ok}, f + 1)));  // misaligned x
  EXPECT_TRUE(IsInvalid(multi({ok}, f, -1)));
  EXPECT_TRUE(multi({no_nibbles}, nullptr, 0).ok());
}

TEST(FusedArgsTest, SwiGluProductsRejectBadArguments) {
  float* f = fake_floats;
  const int32_t* path = fake_ints;
  EXPECT_TRUE(IsInvalid(
      DenseMatMulRowsSwiGlu(f, DType::kInt4, 4, 8, f, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(
      DenseMatMulRowsSwiGlu(f, DType::kF32, 4, 12, f, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(
      DenseMatMulRowsSwiGlu(f, DType::kF32, 4, 8, nullptr, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(
      DenseMatMulRowsSwiGlu(f, DType::kF32, 4, 8, f, nullptr, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(
      DenseMatMulRowsSwiGlu(f, DType::kF32, 4, 8, f, f + 1, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(
      DenseMatMulRowsSwiGlu(f, DType::kF32, 4, 8, f, f, 1, path, 0, nullptr, nullptr)));
  EXPECT_TRUE(DenseMatMulRowsSwiGlu(nullptr, DType::kF32, 4, 8, nullptr, nullptr, 0, nullptr, 0,
                                    nullptr, nullptr)
                  .ok());

  const Int4GpuView w = FakeInt4View(4, 64, 64);
  EXPECT_TRUE(IsInvalid(Int4MatMulRowsSwiGlu(FakeInt4View(4, 72, 64), f, f, 1, path, 0, f,
                                             nullptr)));
  EXPECT_TRUE(IsInvalid(Int4MatMulRowsSwiGlu(w, nullptr, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(Int4MatMulRowsSwiGlu(w, f, nullptr, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(Int4MatMulRowsSwiGlu(w, f, f + 2, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(Int4MatMulRowsSwiGlu(w, f, f, 1, path, 0, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(Int4MatMulRowsSwiGlu(w, f, f, -1, path, 0, f, nullptr)));
  EXPECT_TRUE(Int4MatMulRowsSwiGlu(w, nullptr, nullptr, 0, path, 0, nullptr, nullptr).ok());
}

TEST(FusedArgsTest, RopeWriteKvRowsRejectsBadArguments) {
  // Defaults: 3 query heads, 2 kv heads of 8, one row, a 2-entry table, 4 pages.
  struct Call {
    float* q = fake_floats;
    int n_q = 3;
    float* k = fake_floats;
    const float* v = fake_floats;
    int n_kv = 2;
    int head_dim = 8;
    const int32_t* positions = fake_ints;
    int64_t n_rows = 1;
    const float* inv_freq = fake_floats;
    RopeStyle style = RopeStyle::kHalves;
    const int32_t* table = fake_ints;
    int stride = 2;
    float* region = fake_floats;
    int64_t pages = 4;
    PageShape shape{2, 4, 8};
  };
  const auto run = [](const Call& c) {
    return RopeWriteKvRows(c.q, c.n_q, c.k, c.v, c.n_kv, c.head_dim, c.positions, c.n_rows,
                           c.inv_freq, c.style, c.table, c.stride, c.region, c.pages, c.shape,
                           nullptr, nullptr);
  };
  const auto invalid = [&](auto edit) {
    Call c;
    edit(c);
    return IsInvalid(run(c));
  };
  EXPECT_TRUE(invalid([](Call& c) { c.head_dim = 7; c.shape.head_dim = 7; }));
  EXPECT_TRUE(invalid([](Call& c) { c.head_dim = 0; c.shape.head_dim = 0; }));
  EXPECT_TRUE(invalid([](Call& c) { c.head_dim = 8194; c.shape.head_dim = 8194; }));
  EXPECT_TRUE(invalid([](Call& c) { c.n_q = -1; }));
  EXPECT_TRUE(invalid([](Call& c) { c.n_kv = 0; c.shape.n_kv_heads = 0; }));
  EXPECT_TRUE(invalid([](Call& c) { c.n_kv = 1; }));        // shape says 2 kv heads
  EXPECT_TRUE(invalid([](Call& c) { c.head_dim = 4; }));    // shape says head_dim 8
  EXPECT_TRUE(invalid([](Call& c) { c.shape.block_size = 0; }));
  EXPECT_TRUE(invalid([](Call& c) { c.style = static_cast<RopeStyle>(7); }));
  EXPECT_TRUE(invalid([](Call& c) { c.stride = 0; }));
  EXPECT_TRUE(invalid([](Call& c) { c.pages = -1; }));
  EXPECT_TRUE(invalid([](Call& c) { c.n_rows = -1; }));
  EXPECT_TRUE(invalid([](Call& c) { c.q = nullptr; }));
  EXPECT_TRUE(invalid([](Call& c) { c.k = nullptr; }));
  EXPECT_TRUE(invalid([](Call& c) { c.v = nullptr; }));
  EXPECT_TRUE(invalid([](Call& c) { c.positions = nullptr; }));
  EXPECT_TRUE(invalid([](Call& c) { c.inv_freq = nullptr; }));
  EXPECT_TRUE(invalid([](Call& c) { c.table = nullptr; }));
  EXPECT_TRUE(invalid([](Call& c) { c.region = nullptr; }));
  // No rows: a no-op whatever the pointers.
  Call none;
  none.n_rows = 0;
  none.q = none.k = none.region = nullptr;
  none.v = none.inv_freq = nullptr;
  none.positions = none.table = nullptr;
  EXPECT_TRUE(run(none).ok());
}

// Without a device, valid calls reach the launch, which fails: INTERNAL naming the CUDA error.
TEST(FusedArgsTest, LaunchFailureIsInternalWithTheCudaErrorName) {
  if (HasCudaDevice()) GTEST_SKIP() << "checks the launch error path of a machine without a GPU";
  float* f = fake_floats;
  const auto expect_internal = [](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("cudaError"), std::string::npos) << s;
  };
  const DenseSegment dense{f, 4, f};
  expect_internal(DenseMatMulRowsMulti({dense, dense, dense}, DType::kBF16, 8, f, 1, nullptr,
                                       kRowBackbone, nullptr));
  expect_internal(
      DenseMatMulRowsSwiGlu(f, DType::kF16, 4, 8, f, f, 3, fake_ints, kRowBackbone, f, nullptr));
  const Int4Segment int4{FakeInt4View(4, 64, 64), f};
  expect_internal(Int4MatMulRowsMulti({int4, int4}, f, 2, nullptr, kRowRiver, nullptr));
  expect_internal(Int4MatMulRowsSwiGlu(int4.w, f, f, 1, nullptr, kRowRiver, f, nullptr));
  // No query heads: q may be null.
  expect_internal(RopeWriteKvRows(nullptr, 0, f, f, 2, 8, fake_ints, 1, f, RopeStyle::kHalves,
                                  fake_ints, 2, f, 4, PageShape{2, 4, 8}, nullptr, nullptr));
}

}  // namespace
}  // namespace estuary::cuda
