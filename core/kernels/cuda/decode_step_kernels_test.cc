// Tests of the decode-step kernels (decode_step_kernels.h), CTest label `gpu`. The *ArgsTest
// tests need no device (arguments are rejected on the host before any CUDA call) and pass on the
// CPU; every other test skips itself with "no CUDA device" when none is visible.
//
// Tolerances (inputs uniform in [-1, 1], weights in [-0.05, 0.05]):
//   DenseMatMulRows: |y - y_cpu| <= 2e-5 · Σ_i |x_i · W_oi| + 1e-6 vs kernels::cpu::MatMul on the
//                    same (rounded) weights; a masked call equals the unmasked one bitwise on the
//                    wanted rows and leaves the other rows' sentinel untouched (exact).
//   Int4MatMulRows:  |y - y_ref| <= 2e-5 · Σ_i |x_i| (|s| q_i + |m|) + 1e-6 with y_ref the CPU
//                    MatMul over Int4Matrix::DequantizeToF32 (the int4_matmul_test bound); masked
//                    equals the unmasked Int4MatMul bitwise on the wanted rows; sentinel exact.
//   WriteKvRows:     exact (the whole layer region vs a host copy), error flag exact.
//   ExitDecision:    similarity |s - cpu::CosineSimilarity| <= 1e-5; row_path and
//                    backbone_layers exact vs a host port of forward_batch.cc's exit loop, with
//                    thresholds kept at least 0.01 away from every group's similarity.

#include "core/kernels/cuda/decode_step_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cuda/decode_step_test_util.h"
#include "core/kernels/cuda/int4_matmul.h"
#include "core/kernels/cuda/matmul_test_util.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/testing/random_data.h"

namespace estuary::cuda {
namespace {

using namespace decode_step_test;  // NOLINT(build/namespaces): the tests' shared helpers

// --- Row masks shared by the dense and int4 tests ------------------------------------------

constexpr MaskCase kMasks[] = {
    {Pattern::kNoMask, kRowBackbone, "no mask"},
    {Pattern::kAllBackbone, kRowBackbone, "all rows"},
    {Pattern::kAllRiver, kRowBackbone, "no row"},
    {Pattern::kAlternating, kRowBackbone, "alternating, backbone"},
    {Pattern::kAlternating, kRowRiver, "alternating, river"},
    {Pattern::kMixedWithIdle, kRowRiver, "idle/backbone/river, river"},
};

// Runs `product(row_path_or_null, want, y)` for every mask on a sentinel-filled y and checks the
// wanted rows against `ref` (tolerance tol_scale · bound + 1e-6) and bitwise against the unmasked
// run, and that the other rows still hold the sentinel.
template <typename Product>
void CheckMasks(int64_t n_tokens, int64_t out, const std::vector<float>& ref,
                const std::vector<float>& bound, double tol_scale, Product product) {
  std::vector<float> unmasked;
  for (const MaskCase& mask : kMasks) {
    SCOPED_TRACE(mask.name);
    const std::vector<int32_t> path = RowPaths(mask.pattern, n_tokens);
    DeviceArray<int32_t> d_path(path);
    DeviceArray<float> d_y(std::vector<float>(static_cast<size_t>(n_tokens * out), kSentinel));
    const absl::Status status =
        product(mask.pattern == Pattern::kNoMask ? nullptr : d_path.get(), mask.want, d_y.get());
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> y = d_y.Download();
    if (mask.pattern == Pattern::kNoMask) unmasked = y;
    int failures = 0;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const bool wanted =
          mask.pattern == Pattern::kNoMask || path[static_cast<size_t>(t)] == mask.want;
      for (int64_t o = 0; o < out; ++o) {
        const size_t k = static_cast<size_t>(t * out + o);
        bool ok = true;
        if (!wanted) {
          ok = y[k] == kSentinel;
        } else {
          ok = std::fabs(static_cast<double>(y[k]) - ref[k]) <= tol_scale * bound[k] + 1e-6 &&
               y[k] == unmasked[k];
        }
        if (!ok && ++failures <= kMaxReported) {
          ADD_FAILURE() << "t=" << t << " o=" << o << " wanted=" << wanted << " gpu=" << y[k]
                        << " ref=" << ref[k] << " unmasked=" << unmasked[k]
                        << " bound=" << bound[k];
        }
      }
    }
    EXPECT_EQ(failures, 0);
  }
}

// --- DenseMatMulRows ------------------------------------------------------------------------

struct DenseCase {
  int64_t out = 0;
  int64_t in = 0;
  int64_t n_tokens = 0;
  DType dtype = DType::kF32;
};

std::string DenseName(const ::testing::TestParamInfo<DenseCase>& info) {
  const DenseCase& c = info.param;
  return absl::StrCat(c.out, "x", c.in, "_n", c.n_tokens, "_", DTypeName(c.dtype));
}

std::vector<DenseCase> DenseCases() {
  std::vector<DenseCase> cases;
  // Tiny: one chunk, a partial row group, and 2 warps over 65 chunks; then Llama-3.2-1B
  // projections (q/o, k/v, gate/up, down): 1, 4 and 8 warps per block.
  const std::pair<int64_t, int64_t> tiny[] = {{3, 8}, {17, 40}, {70, 520}};
  const std::pair<int64_t, int64_t> llama[] = {
      {2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [out, in] : tiny) {
      // 200 tokens: the row scan takes several rounds of a small block.
      for (int64_t n : {1, 3, 8, 32, 200}) cases.push_back({out, in, n, dtype});
    }
    for (auto [out, in] : llama) {
      for (int64_t n : {1, 3, 8, 32}) cases.push_back({out, in, n, dtype});
    }
  }
  return cases;
}

class DenseMatMulRowsTest : public ::testing::TestWithParam<DenseCase> {};

TEST_P(DenseMatMulRowsTest, MatchesCpuMatMulOnWantedRows) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const DenseCase c = GetParam();
  const auto seed = static_cast<uint32_t>(c.out * 31 + c.in * 7 + c.n_tokens);
  const Tensor w = RandomWeights(c.dtype, c.out, c.in, seed);
  const std::vector<float> x = RandomVector(c.n_tokens * c.in, seed + 1);

  std::vector<float> ref(static_cast<size_t>(c.n_tokens * c.out));
  ASSERT_TRUE(kernels::cpu::MatMul(w, x.data(), c.n_tokens, ref.data()).ok());
  const std::vector<float> bound = CpuMatMul(Abs(Widened(w)), c.out, c.in, Abs(x), c.n_tokens);

  DeviceArray<uint8_t> d_w(Bytes(w));
  DeviceArray<float> d_x(x);
  CheckMasks(c.n_tokens, c.out, ref, bound, 2e-5,
             [&](const int32_t* row_path, int32_t want, float* y) {
               return DenseMatMulRows(d_w.get(), c.dtype, c.out, c.in, d_x.get(), c.n_tokens,
                                      row_path, want, y, nullptr);
             });
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseMatMulRowsTest, ::testing::ValuesIn(DenseCases()), DenseName);

// --- Int4MatMulRows -------------------------------------------------------------------------

struct Int4Case {
  int64_t rows = 0;
  int64_t cols = 0;
  int group = 64;
  int64_t n_tokens = 1;
};

std::string Int4Name(const ::testing::TestParamInfo<Int4Case>& info) {
  const Int4Case& c = info.param;
  return absl::StrCat(c.rows, "x", c.cols, "_g", c.group, "_n", c.n_tokens);
}

std::vector<Int4Case> Int4Cases() {
  std::vector<Int4Case> cases;
  const std::tuple<int64_t, int64_t, int> tiny[] = {{5, 64, 64}, {33, 256, 128}, {17, 384, 64}};
  for (auto [rows, cols, group] : tiny) {
    for (int64_t n : {1, 3, 8, 32, 200}) cases.push_back({rows, cols, group, n});
  }
  const std::tuple<int64_t, int64_t, int> llama[] = {{2048, 2048, 128}, {512, 2048, 64}};
  for (auto [rows, cols, group] : llama) {
    for (int64_t n : {1, 3, 8, 32}) cases.push_back({rows, cols, group, n});
  }
  return cases;
}

class Int4MatMulRowsTest : public ::testing::TestWithParam<Int4Case> {};

TEST_P(Int4MatMulRowsTest, MatchesDequantizedProductOnWantedRows) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const Int4Case c = GetParam();
  const auto seed = static_cast<uint32_t>(c.rows * 3 + c.cols + c.group + c.n_tokens);
  absl::StatusOr<QuantizedInt4> q =
      QuantizeInt4(RandomWeights(DType::kF32, c.rows, c.cols, seed), c.group);
  ASSERT_TRUE(q.ok()) << q.status();
  const std::vector<float> x = RandomVector(c.n_tokens * c.cols, seed + 1);
  const std::vector<float> ref = CpuMatMul(q->dequantized, c.rows, c.cols, x, c.n_tokens);
  const std::vector<float> bound =
      CpuMatMul(Int4Magnitudes(q->matrix), c.rows, c.cols, Abs(x), c.n_tokens);

  absl::StatusOr<Int4GpuMatrix> d_w = Int4GpuMatrix::Upload(q->host);
  ASSERT_TRUE(d_w.ok()) << d_w.status();
  DeviceArray<float> d_x(x);
  // The existing unmasked product must agree with the no-mask row of CheckMasks bit for bit.
  DeviceArray<float> d_plain(ref.size());
  ASSERT_TRUE(Int4MatMul(d_w->view(), d_x.get(), c.n_tokens, d_plain.get(), nullptr).ok());
  const std::vector<float> plain = d_plain.Download();
  CheckMasks(
      c.n_tokens, c.rows, ref, bound, 2e-5, [&](const int32_t* row_path, int32_t want, float* y) {
        return Int4MatMulRows(d_w->view(), d_x.get(), c.n_tokens, row_path, want, y, nullptr);
      });
  DeviceArray<float> d_again(ref.size());
  ASSERT_TRUE(Int4MatMulRows(d_w->view(), d_x.get(), c.n_tokens, nullptr, kRowBackbone,
                             d_again.get(), nullptr)
                  .ok());
  EXPECT_EQ(d_again.Download(), plain);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int4MatMulRowsTest, ::testing::ValuesIn(Int4Cases()), Int4Name);

// --- WriteKvRows ----------------------------------------------------------------------------

class WriteKvRowsTest : public ::testing::TestWithParam<PageShape> {};

std::string PageShapeName(const ::testing::TestParamInfo<PageShape>& info) {
  const PageShape& s = info.param;
  return absl::StrCat("h", s.n_kv_heads, "_b", s.block_size, "_d", s.head_dim);
}

// The host reference: `region` after writing one step's valid rows; returns whether an error is
// flagged. Page ids beyond the layer or negative, and a position past the table, must be skipped
// and flagged; padding (position < 0) is skipped silently whatever its table says.
bool ReferenceWriteKv(const std::vector<KvRow>& rows, const std::vector<int32_t>& table, int stride,
                      const std::vector<float>& k, const std::vector<float>& v, int64_t num_pages,
                      const PageShape& shape, std::vector<float>& region) {
  const int64_t row_floats = int64_t{shape.n_kv_heads} * shape.head_dim;
  bool error = false;
  for (size_t t = 0; t < rows.size(); ++t) {
    const int pos = rows[t].position;
    if (pos < 0) continue;
    const int block = pos / shape.block_size;
    if (block >= stride) {
      error = true;
      continue;
    }
    const int32_t page = table[t * static_cast<size_t>(stride) + static_cast<size_t>(block)];
    if (page < 0 || page >= num_pages) {
      error = true;
      continue;
    }
    const int slot = pos % shape.block_size;
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < shape.n_kv_heads; ++h) {
        for (int d = 0; d < shape.head_dim; ++d) {
          const int64_t dst = page * shape.page_floats() +
                              (int64_t{kv} * shape.n_kv_heads + h) * shape.head_floats() +
                              int64_t{slot} * shape.head_dim + d;
          const std::vector<float>& src = kv == 0 ? k : v;
          region[static_cast<size_t>(dst)] =
              src[t * static_cast<size_t>(row_floats) + static_cast<size_t>(h) * shape.head_dim +
                  static_cast<size_t>(d)];
        }
      }
    }
  }
  return error;
}

void RunWriteKv(const PageShape& shape, const std::vector<KvRow>& rows, uint32_t seed) {
  constexpr int kStride = 3;
  constexpr int64_t kPages = 10;
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t row_floats = int64_t{shape.n_kv_heads} * shape.head_dim;
  const std::vector<float> k = RandomVector(n * row_floats, seed);
  const std::vector<float> v = RandomVector(n * row_floats, seed + 1);
  std::vector<float> region = RandomVector(kPages * shape.page_floats(), seed + 2);
  const auto [table, positions] = MakeKvRowTables(rows, kStride, shape.block_size, kPages, seed);
  DeviceArray<float> d_k(k), d_v(v), d_region(region);
  DeviceArray<int32_t> d_positions(positions), d_table(table), d_flag(std::vector<int32_t>{0});
  ASSERT_TRUE(WriteKvRows(d_k.get(), d_v.get(), n, d_positions.get(), d_table.get(), kStride,
                          d_region.get(), kPages, shape, d_flag.get(), nullptr)
                  .ok());
  const bool want_error = ReferenceWriteKv(rows, table, kStride, k, v, kPages, shape, region);
  EXPECT_EQ(d_region.Download(), region);
  EXPECT_EQ(d_flag.Download()[0], want_error ? 1 : 0);
}

TEST_P(WriteKvRowsTest, WritesValidRowsAndFlagsBadOnes) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const PageShape shape = GetParam();
  const int b = shape.block_size;
  ASSERT_GE(b, 3) << "the rows below need three slots per page";
  // Distinct (page, slot) targets for the valid rows (3 * b positions fit the 3-entry table).
  RunWriteKv(shape,
             {{0, 3},          // first slot of the first block
              {b + 1, 0},      // second block, second slot
              {3 * b - 1, 9},  // last slot of the last block, last page
              {-1, -7},        // padding: skipped, its bad id never read
              {3 * b, 4},      // past the page table: flagged
              {b - 1, 10},     // page id == num_pages: flagged
              {b, -1},         // negative page id: flagged
              {2 * b - 1, 3},  // same page as row 0, another slot
              {1, 5}},
             17u);
}

TEST_P(WriteKvRowsTest, ValidRowsAndPaddingLeaveTheFlagClear) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const PageShape shape = GetParam();
  const int b = shape.block_size;
  RunWriteKv(shape, {{-1, 99}, {2 * b, 2}, {0, 7}, {-5, -5}, {b, 8}}, 29u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, WriteKvRowsTest,
                         ::testing::Values(PageShape{2, 4, 8}, PageShape{3, 3, 5},
                                           PageShape{8, 16, 64}),
                         PageShapeName);

// --- ExitDecision ---------------------------------------------------------------------------

struct ExitCase {
  int64_t dim = 0;
  int n_rows = 0;
  int rule = 0;
  bool similarity_out = false;
};

std::string ExitName(const ::testing::TestParamInfo<ExitCase>& info) {
  const ExitCase& c = info.param;
  return absl::StrCat("d", c.dim, "_r", c.n_rows, c.rule == 0 ? "_batchmin" : "_split",
                      c.similarity_out ? "_sim" : "_fused");
}

// A batch for the decision: rows in groups of 1..4 consecutive rows (group ids shuffled), some
// river and idle rows, one backbone row with a zero input, one with an out-of-range group id.
struct ExitBatch {
  std::vector<float> layer_in;
  std::vector<float> layer_out;
  std::vector<int32_t> row_group;
  std::vector<int32_t> row_path;
  std::vector<float> s_ref;  // CPU CosineSimilarity of each row (every row, as f32)
};

ExitBatch MakeExitBatch(int64_t dim, int n, uint32_t seed) {
  ExitBatch b;
  b.layer_in = RandomVector(n * dim, seed);
  b.layer_out = RandomVector(n * dim, seed + 1);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mix(0.05f, 1.5f);
  for (int t = 0; t < n; ++t) {  // out = in + a row-dependent amount of noise: s spread over (0, 1)
    const float a = mix(rng);
    for (int64_t i = 0; i < dim; ++i) {
      const size_t k = static_cast<size_t>(t * dim + i);
      b.layer_out[k] = b.layer_in[k] + a * b.layer_out[k];
    }
  }
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.row_group.resize(static_cast<size_t>(n));
  b.row_path.assign(static_cast<size_t>(n), kRowBackbone);
  int group = 0;
  for (int t = 0; t < n; ++group) {
    const int size = std::min<int>(n - t, 1 + static_cast<int>(rng() % 4));
    for (int j = 0; j < size; ++j)
      b.row_group[static_cast<size_t>(t + j)] = ids[static_cast<size_t>(group)];
    t += size;
  }
  if (n >= 7) {
    b.row_path[1] = kRowRiver;  // a river row (maybe inside a backbone group)
    b.row_path[static_cast<size_t>(n - 1)] = kRowIdle;  // padding, sharing a group id
    b.row_group[static_cast<size_t>(n - 1)] = b.row_group[0];
    std::fill_n(b.layer_out.begin() + (n - 1) * dim, dim, 0.0f);  // would pull group 0 down
    b.row_group[3] = n + 5;                                // out of range: a group of its own
    std::fill_n(b.layer_in.begin() + 5 * dim, dim, 0.0f);  // zero vector: s = 0
  }
  b.s_ref.resize(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) {
    b.s_ref[static_cast<size_t>(t)] = static_cast<float>(kernels::cpu::CosineSimilarity(
        b.layer_in.data() + t * dim, b.layer_out.data() + t * dim, dim));
  }
  return b;
}

// The group of a backbone row, as the kernel defines it (out of range: its own, keyed -1 - t).
int64_t GroupKey(const ExitBatch& b, int t) {
  const int32_t g = b.row_group[static_cast<size_t>(t)];
  const auto n = static_cast<int32_t>(b.row_group.size());
  return g >= 0 && g < n ? g : -1 - int64_t{t};
}

// min over each group's backbone rows of s_ref, indexed by row.
std::vector<float> GroupSimilarity(const ExitBatch& b) {
  const int n = static_cast<int>(b.row_path.size());
  std::vector<float> s_group(static_cast<size_t>(n), std::numeric_limits<float>::infinity());
  for (int t = 0; t < n; ++t) {
    if (b.row_path[static_cast<size_t>(t)] != kRowBackbone) continue;
    for (int u = 0; u < n; ++u) {
      if (b.row_path[static_cast<size_t>(u)] == kRowBackbone && GroupKey(b, u) == GroupKey(b, t)) {
        s_group[static_cast<size_t>(t)] =
            std::min(s_group[static_cast<size_t>(t)], b.s_ref[static_cast<size_t>(u)]);
      }
    }
  }
  return s_group;
}

// The exit loop of ForwardBatch (core/model/forward_batch.cc) on rows: which rows leave.
std::vector<bool> ReferenceLeaves(const ExitBatch& b, const std::vector<float>& s_group,
                                  const std::vector<float>& thresholds, int rule, bool may_exit,
                                  bool forced) {
  const size_t n = b.row_path.size();
  float batch_margin = std::numeric_limits<float>::infinity();
  for (size_t t = 0; t < n; ++t) {
    if (b.row_path[t] == kRowBackbone) {
      batch_margin = std::min(batch_margin, s_group[t] - thresholds[t]);
    }
  }
  std::vector<bool> leaves(n, false);
  for (size_t t = 0; t < n; ++t) {
    if (b.row_path[t] != kRowBackbone) continue;
    const float margin = rule == 0 ? batch_margin : s_group[t] - thresholds[t];
    leaves[t] = forced || (may_exit && margin > 0.0f);
  }
  return leaves;
}

class ExitDecisionTest : public ::testing::TestWithParam<ExitCase> {};

TEST_P(ExitDecisionTest, MatchesTheCpuExitLoop) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const ExitCase c = GetParam();
  const int n = c.n_rows;
  const ExitBatch b = MakeExitBatch(c.dim, n, static_cast<uint32_t>(c.dim + n));
  const std::vector<float> s_group = GroupSimilarity(b);
  constexpr int kNextLayer = 7;
  constexpr int32_t kLayersBefore = 99;

  // Per-group offsets s_group - tau, at least 0.01 away from 0: all positive, or mixed signs.
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::uniform_real_distribution<float> gap(0.01f, 0.05f);
  std::vector<float> up(static_cast<size_t>(n) + 1);
  std::vector<float> sign(static_cast<size_t>(n) + 1);
  for (size_t g = 0; g < up.size(); ++g) {
    up[g] = gap(rng);
    sign[g] = g % 3 == 1 ? -1.0f : 1.0f;  // group ids 1, 4, 7, ... would stay
  }
  struct Scenario {
    const char* name;
    bool mixed_signs;
    bool may_exit;
    bool forced;
  };
  const Scenario scenarios[] = {{"all above", false, true, false},
                                {"some below", true, true, false},
                                {"forced", true, false, true},
                                {"may not exit", false, false, false}};
  for (const Scenario& sc : scenarios) {
    SCOPED_TRACE(sc.name);
    std::vector<float> thresholds(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) {
      const int64_t key = GroupKey(b, t);
      const size_t g = key >= 0 ? static_cast<size_t>(key) : static_cast<size_t>(n);
      const float s =
          std::isfinite(s_group[static_cast<size_t>(t)]) ? s_group[static_cast<size_t>(t)] : 0.0f;
      thresholds[static_cast<size_t>(t)] = s - (sc.mixed_signs ? sign[g] : 1.0f) * up[g];
    }
    DeviceArray<float> d_in(b.layer_in), d_out(b.layer_out), d_thresholds(thresholds);
    DeviceArray<int32_t> d_group(b.row_group), d_path(b.row_path);
    DeviceArray<int32_t> d_layers(std::vector<int32_t>(static_cast<size_t>(n), kLayersBefore));
    DeviceArray<float> d_sim(std::vector<float>(static_cast<size_t>(n), kSentinel));
    ExitDecisionArgs args;
    args.layer_in = d_in.get();
    args.layer_out = d_out.get();
    args.dim = c.dim;
    args.n_rows = n;
    args.row_group = d_group.get();
    args.thresholds = d_thresholds.get();
    args.row_path = d_path.get();
    args.backbone_layers = d_layers.get();
    args.similarity = c.similarity_out ? d_sim.get() : nullptr;
    args.next_layer = kNextLayer;
    args.rule = c.rule;
    args.may_exit = sc.may_exit ? 1 : 0;
    args.forced = sc.forced ? 1 : 0;
    const absl::Status status = ExitDecision(args, nullptr);
    ASSERT_TRUE(status.ok()) << status;

    const std::vector<bool> leaves =
        ReferenceLeaves(b, s_group, thresholds, c.rule, sc.may_exit, sc.forced);
    const std::vector<int32_t> path = d_path.Download();
    const std::vector<int32_t> layers = d_layers.Download();
    const std::vector<float> sim = d_sim.Download();
    int failures = 0;
    for (int t = 0; t < n; ++t) {
      const auto i = static_cast<size_t>(t);
      const int32_t want_path = leaves[i] ? kRowRiver : b.row_path[i];
      const int32_t want_layers = leaves[i] ? kNextLayer : kLayersBefore;
      bool ok = path[i] == want_path && layers[i] == want_layers;
      if (c.similarity_out) {
        ok = ok && (b.row_path[i] == kRowBackbone ? std::fabs(sim[i] - b.s_ref[i]) <= 1e-5f
                                                  : sim[i] == kSentinel);
      }
      if (!ok && ++failures <= kMaxReported) {
        ADD_FAILURE() << "row " << t << " path " << b.row_path[i] << " -> " << path[i] << " (want "
                      << want_path << "), layers " << layers[i] << " (want " << want_layers
                      << "), s " << sim[i] << " (cpu " << b.s_ref[i] << ")";
      }
    }
    EXPECT_EQ(failures, 0);
  }
}

std::vector<ExitCase> ExitCases() {
  std::vector<ExitCase> cases;
  for (int64_t dim : {8, 99, 2048, 8192}) {  // 99: the scalar (non-float4) loads
    for (int n : {1, 7, 64, 1024}) {
      for (int rule : {0, 1}) {
        for (bool sim : {false, true}) cases.push_back({dim, n, rule, sim});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExitDecisionTest, ::testing::ValuesIn(ExitCases()), ExitName);

// --- Argument checks (no device needed) ----------------------------------------------------

// Host pointers that are never dereferenced: every call below fails its checks before launching.
alignas(16) float fake_floats[64] = {};
alignas(16) int32_t fake_ints[64] = {};

TEST(DecodeStepArgsTest, DenseMatMulRowsRejectsBadArguments) {
  float* f = fake_floats;
  const int32_t* path = fake_ints;
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kInt4, 4, 8, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kBF16, 4, 12, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kBF16, 4, 0, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kF32, 0, 8, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(
      DenseMatMulRows(f, DType::kF32, (int64_t{1} << 30) + 1, 8, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kF16, 4, 8, f, -1, path, 0, f, nullptr)));
  EXPECT_TRUE(
      IsInvalid(DenseMatMulRows(f, DType::kF16, 4, 8, f, 65535 * 8 + 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(nullptr, DType::kF32, 4, 8, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kF32, 4, 8, nullptr, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kF32, 4, 8, f, 1, path, 0, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f + 1, DType::kF32, 4, 8, f, 1, path, 0, f, nullptr)));
  EXPECT_TRUE(IsInvalid(DenseMatMulRows(f, DType::kF32, 4, 8, f + 2, 1, path, 0, f, nullptr)));
  // No tokens: nothing to do, whatever the pointers.
  EXPECT_TRUE(
      DenseMatMulRows(nullptr, DType::kBF16, 4, 8, nullptr, 0, nullptr, 0, nullptr, nullptr).ok());
}

TEST(DecodeStepArgsTest, Int4MatMulRowsRejectsBadArguments) {
  Int4GpuView w = Int4ViewOfShape(4, 72, 64);  // cols not a multiple of 32
  EXPECT_TRUE(IsInvalid(Int4MatMulRows(w, fake_floats, 1, fake_ints, 0, fake_floats, nullptr)));
  w = Int4ViewOfShape(4, 64, 64);
  // No weight pointers.
  EXPECT_TRUE(IsInvalid(Int4MatMulRows(w, fake_floats, 1, fake_ints, 0, fake_floats, nullptr)));
  EXPECT_TRUE(IsInvalid(Int4MatMulRows(w, fake_floats, -1, fake_ints, 0, fake_floats, nullptr)));
  EXPECT_TRUE(Int4MatMulRows(w, fake_floats, 0, fake_ints, 0, fake_floats, nullptr).ok());
}

TEST(DecodeStepArgsTest, WriteKvRowsRejectsBadArguments) {
  float* f = fake_floats;
  const int32_t* ids = fake_ints;
  const PageShape shape{2, 4, 8};
  EXPECT_TRUE(
      IsInvalid(WriteKvRows(f, f, 1, ids, ids, 2, f, 4, PageShape{0, 4, 8}, nullptr, nullptr)));
  EXPECT_TRUE(
      IsInvalid(WriteKvRows(f, f, 1, ids, ids, 2, f, 4, PageShape{2, -1, 8}, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(WriteKvRows(f, f, 1, ids, ids, 0, f, 4, shape, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(WriteKvRows(f, f, -1, ids, ids, 2, f, 4, shape, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(WriteKvRows(f, f, 1, ids, ids, 2, f, -1, shape, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(WriteKvRows(f, nullptr, 1, ids, ids, 2, f, 4, shape, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(WriteKvRows(f, f, 1, nullptr, ids, 2, f, 4, shape, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(WriteKvRows(f, f, 1, ids, nullptr, 2, f, 4, shape, nullptr, nullptr)));
  EXPECT_TRUE(IsInvalid(WriteKvRows(f, f, 1, ids, ids, 2, nullptr, 4, shape, nullptr, nullptr)));
  EXPECT_TRUE(
      WriteKvRows(nullptr, nullptr, 0, nullptr, nullptr, 2, nullptr, 4, shape, nullptr, nullptr)
          .ok());
}

ExitDecisionArgs FakeExitArgs() {
  ExitDecisionArgs a;
  a.layer_in = fake_floats;
  a.layer_out = fake_floats;
  a.dim = 8;
  a.n_rows = 4;
  a.row_group = fake_ints;
  a.thresholds = fake_floats;
  a.row_path = fake_ints;
  a.backbone_layers = fake_ints;
  return a;
}

TEST(DecodeStepArgsTest, ExitDecisionRejectsBadArguments) {
  ExitDecisionArgs a = FakeExitArgs();
  a.n_rows = 1025;
  EXPECT_TRUE(IsInvalid(ExitDecision(a, nullptr)));
  a.n_rows = -1;
  EXPECT_TRUE(IsInvalid(ExitDecision(a, nullptr)));
  a = FakeExitArgs();
  a.dim = 0;
  EXPECT_TRUE(IsInvalid(ExitDecision(a, nullptr)));
  a = FakeExitArgs();
  a.rule = 2;
  EXPECT_TRUE(IsInvalid(ExitDecision(a, nullptr)));
  const auto null_one = [](auto field) {
    ExitDecisionArgs b = FakeExitArgs();
    b.*field = nullptr;
    return ExitDecision(b, nullptr);
  };
  EXPECT_TRUE(IsInvalid(null_one(&ExitDecisionArgs::layer_in)));
  EXPECT_TRUE(IsInvalid(null_one(&ExitDecisionArgs::layer_out)));
  EXPECT_TRUE(IsInvalid(null_one(&ExitDecisionArgs::row_group)));
  EXPECT_TRUE(IsInvalid(null_one(&ExitDecisionArgs::thresholds)));
  EXPECT_TRUE(IsInvalid(null_one(&ExitDecisionArgs::row_path)));
  EXPECT_TRUE(IsInvalid(null_one(&ExitDecisionArgs::backbone_layers)));
  a = ExitDecisionArgs{};
  a.dim = 8;  // no rows: a no-op
  EXPECT_TRUE(ExitDecision(a, nullptr).ok());
}

// Without a device a valid call reaches the launch, which fails: INTERNAL naming the CUDA error.
TEST(DecodeStepArgsTest, LaunchFailureIsInternalWithTheCudaErrorName) {
  if (HasCudaDevice()) GTEST_SKIP() << "checks the launch error path of a machine without a GPU";
  const absl::Status s = ExitDecision(FakeExitArgs(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("cudaError"), std::string::npos) << s;
  const absl::Status d = DenseMatMulRows(fake_floats, DType::kBF16, 4, 8, fake_floats, 1, nullptr,
                                         kRowBackbone, fake_floats, nullptr);
  EXPECT_EQ(d.code(), absl::StatusCode::kInternal) << d;
}

}  // namespace
}  // namespace estuary::cuda
