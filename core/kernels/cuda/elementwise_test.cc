// GPU tests (CTest label `gpu`) of the CUDA element-wise kernels against the CPU kernels
// (core/kernels/cpu/kernels.h) and the CPU sampler. Every test that touches the device starts by
// skipping itself when no CUDA device is visible; ArgumentChecks needs no device (the launchers
// reject bad arguments on the host before any CUDA call).
//
// Tolerances (GPU vs CPU, inputs of magnitude <= 1 unless stated):
//   residual add (h_in + delta), embedding rows, argmax, page copies: exact
//   RMSNorm:        |gpu - cpu| <= 1e-4 * |cpu| + 1e-6   (f32 sums in a different order)
//   similarity:     |gpu - cpu| <= 1e-5                  (f32 block sums vs double on the CPU)
//   RoPE:           |gpu - cpu| <= 1e-5                  (CUDA cosf/sinf within 2 ulp of glibc)
//   SwiGLU:         |gpu - cpu| <= 1e-5 * |cpu| + 1e-7   (CUDA expf within 2 ulp)
//   sampling:       greedy exact; the sampled token lies in the CPU's top-k set and in a top-p
//                   set computed with top_p + 1e-4 (f32 vs double probabilities); frequencies
//                   over 4000 seeds within 0.03 of the probabilities (about 4 sigma).

#include "core/kernels/cuda/elementwise.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cuda/elementwise_test_util.h"
#include "core/sampling/sampler.h"
#include "core/tensor/half_float.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/testing/random_data.h"

namespace estuary::cuda {
namespace {

bool HasCudaDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_CUDA_DEVICE() \
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device"

// Device memory for `n` elements of T, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T)),
              cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  // Waits for the device, then copies everything back.
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

using ::estuary::testing::MakeTensor;
using ::estuary::testing::RandomVector;

// The raw bytes of a host tensor, on the device.
std::vector<uint8_t> Bytes(const Tensor& t) {
  const auto* raw = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(raw, raw + t.nbytes());
}

// --- ResidualRmsNormSimilarity and RmsNorm -------------------------------------------------

struct NormCase {
  int64_t n_tokens;
  int64_t dim;
};

class NormTest : public ::testing::TestWithParam<std::tuple<NormCase, DType>> {};

TEST_P(NormTest, ResidualNormAndSimilarityMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const auto [shape, dtype] = GetParam();
  const int64_t n = shape.n_tokens * shape.dim;
  const float eps = 1e-5f;
  const std::vector<float> h_in = RandomVector(n, 1);
  const std::vector<float> delta = RandomVector(n, 2, -0.1f, 0.1f);
  const Tensor weight = MakeTensor(dtype, {shape.dim}, RandomVector(shape.dim, 3, 0.5f, 1.5f));

  DeviceBuffer<float> residual(h_in), d_delta(delta), normed(static_cast<size_t>(n)),
      similarity(static_cast<size_t>(shape.n_tokens));
  DeviceBuffer<uint8_t> d_weight(Bytes(weight));
  ASSERT_TRUE(ResidualRmsNormSimilarity(residual.get(), d_delta.get(), d_weight.get(), dtype,
                                        shape.n_tokens, shape.dim, eps, normed.get(),
                                        similarity.get(), nullptr)
                  .ok());
  const std::vector<float> got_residual = residual.ToHost();
  const std::vector<float> got_normed = normed.ToHost();
  const std::vector<float> got_similarity = similarity.ToHost();

  // CPU reference: h_out = h_in + delta, RmsNorm(h_out), CosineSimilarity(h_in, h_out).
  std::vector<float> h_out(static_cast<size_t>(n));
  for (size_t i = 0; i < h_out.size(); ++i) h_out[i] = h_in[i] + delta[i];
  std::vector<float> want_normed(static_cast<size_t>(n));
  kernels::cpu::RmsNorm(h_out.data(), weight, shape.n_tokens, shape.dim, eps, want_normed.data());

  for (size_t i = 0; i < h_out.size(); ++i) ASSERT_EQ(got_residual[i], h_out[i]) << i;
  for (size_t i = 0; i < want_normed.size(); ++i) {
    ASSERT_NEAR(got_normed[i], want_normed[i], 1e-4 * std::abs(want_normed[i]) + 1e-6) << i;
  }
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    const double want = kernels::cpu::CosineSimilarity(h_in.data() + t * shape.dim,
                                                       h_out.data() + t * shape.dim, shape.dim);
    EXPECT_NEAR(got_similarity[static_cast<size_t>(t)], want, 1e-5) << "token " << t;
  }
}

TEST_P(NormTest, PlainRmsNormMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const auto [shape, dtype] = GetParam();
  const int64_t n = shape.n_tokens * shape.dim;
  const float eps = 1e-6f;
  const std::vector<float> x = RandomVector(n, 4, -2.0f, 2.0f);
  const Tensor weight = MakeTensor(dtype, {shape.dim}, RandomVector(shape.dim, 5, 0.5f, 1.5f));

  DeviceBuffer<float> d_x(x), out(static_cast<size_t>(n));
  DeviceBuffer<uint8_t> d_weight(Bytes(weight));
  ASSERT_TRUE(RmsNorm(d_x.get(), d_weight.get(), dtype, shape.n_tokens, shape.dim, eps, out.get(),
                      nullptr)
                  .ok());
  const std::vector<float> got = out.ToHost();
  std::vector<float> want(static_cast<size_t>(n));
  kernels::cpu::RmsNorm(x.data(), weight, shape.n_tokens, shape.dim, eps, want.data());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i]) + 1e-6) << i;
  }
  EXPECT_EQ(d_x.ToHost(), x);  // the input is not modified
}

std::string NormName(const ::testing::TestParamInfo<NormTest::ParamType>& info) {
  const auto& [shape, dtype] = info.param;
  return std::string(DTypeName(dtype)) + "_t" + std::to_string(shape.n_tokens) + "_d" +
         std::to_string(shape.dim);
}

// Tiny (below one warp, not a multiple of 32) and Llama-3.2-1B (dim 2048); 8192 for a wide one.
INSTANTIATE_TEST_SUITE_P(Shapes, NormTest,
                         ::testing::Combine(::testing::Values(NormCase{1, 8}, NormCase{5, 100},
                                                              NormCase{7, 2048},
                                                              NormCase{2, 8192}),
                                            ::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16)),
                         NormName);

TEST(ResidualRmsNormSimilarityTest, ZeroInputGivesZeroSimilarity) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t dim = 64;
  // Token 0: h_in = 0 (CosineSimilarity is 0 for a zero vector); token 1: delta = 0 (cos = 1).
  std::vector<float> h_in(2 * dim, 0.0f);
  for (int64_t i = dim; i < 2 * dim; ++i) h_in[static_cast<size_t>(i)] = 0.5f;
  std::vector<float> delta(2 * dim, 0.0f);
  for (int64_t i = 0; i < dim; ++i) delta[static_cast<size_t>(i)] = 1.0f;
  const std::vector<float> weight(dim, 1.0f);
  DeviceBuffer<float> residual(h_in), d_delta(delta), d_weight(weight), normed(2 * dim),
      similarity(2);
  ASSERT_TRUE(ResidualRmsNormSimilarity(residual.get(), d_delta.get(), d_weight.get(),
                                        DType::kF32, 2, dim, 1e-5f, normed.get(),
                                        similarity.get(), nullptr)
                  .ok());
  const std::vector<float> got = similarity.ToHost();
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_NEAR(got[1], 1.0f, 1e-6);
}

// --- RoPE ----------------------------------------------------------------------------------

struct RopeCase {
  int n_tokens;
  int n_q_heads;
  int n_kv_heads;
  int head_dim;
  bool llama3_scaling;  // theta 500000 with Llama 3.2's scaling, else theta 10000 unscaled
};

class RopeTest : public ::testing::TestWithParam<std::tuple<RopeCase, RopeStyle>> {};

TEST_P(RopeTest, MatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const auto [c, style] = GetParam();
  const std::vector<float> inv_freq =
      elementwise_test::TestRopeInverseFrequencies(c.head_dim, c.llama3_scaling);
  std::vector<int32_t> positions(static_cast<size_t>(c.n_tokens));
  for (int t = 0; t < c.n_tokens; ++t) positions[static_cast<size_t>(t)] = t * 1237 % 9000;
  positions[0] = 0;
  const int64_t q_size = int64_t{c.n_tokens} * c.n_q_heads * c.head_dim;
  const int64_t k_size = int64_t{c.n_tokens} * c.n_kv_heads * c.head_dim;
  const std::vector<float> q = RandomVector(q_size, 6);
  const std::vector<float> k = RandomVector(k_size, 7);

  DeviceBuffer<float> d_q(q), d_k(k), d_inv_freq(inv_freq);
  DeviceBuffer<int32_t> d_positions(positions);
  ASSERT_TRUE(ApplyRope(d_q.get(), c.n_q_heads, d_k.get(), c.n_kv_heads, c.head_dim,
                        d_positions.get(), c.n_tokens, d_inv_freq.get(), style, nullptr)
                  .ok());
  const std::vector<float> got_q = d_q.ToHost();
  const std::vector<float> got_k = d_k.ToHost();

  std::vector<float> want_q = q, want_k = k;
  for (int t = 0; t < c.n_tokens; ++t) {
    const int pos = positions[static_cast<size_t>(t)];
    kernels::cpu::ApplyRope(want_q.data() + int64_t{t} * c.n_q_heads * c.head_dim, c.n_q_heads,
                            c.head_dim, pos, inv_freq, style);
    kernels::cpu::ApplyRope(want_k.data() + int64_t{t} * c.n_kv_heads * c.head_dim, c.n_kv_heads,
                            c.head_dim, pos, inv_freq, style);
  }
  for (size_t i = 0; i < want_q.size(); ++i) ASSERT_NEAR(got_q[i], want_q[i], 1e-5) << "q " << i;
  for (size_t i = 0; i < want_k.size(); ++i) ASSERT_NEAR(got_k[i], want_k[i], 1e-5) << "k " << i;
}

std::string RopeName(const ::testing::TestParamInfo<RopeTest::ParamType>& info) {
  const auto& [c, style] = info.param;
  return std::string(style == RopeStyle::kInterleaved ? "interleaved" : "halves") + "_t" +
         std::to_string(c.n_tokens) + "_q" + std::to_string(c.n_q_heads) + "_kv" +
         std::to_string(c.n_kv_heads) + "_hd" + std::to_string(c.head_dim) +
         (c.llama3_scaling ? "_llama3" : "");
}

// Tiny, and Llama-3.2-1B (32 query heads, 8 KV heads, head_dim 64, llama3 scaling).
INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeTest,
    ::testing::Combine(::testing::Values(RopeCase{3, 2, 1, 8, false}, RopeCase{1, 1, 0, 2, false},
                                         RopeCase{9, 32, 8, 64, true}),
                       ::testing::Values(RopeStyle::kInterleaved, RopeStyle::kHalves)),
    RopeName);

// --- SwiGLU --------------------------------------------------------------------------------

class SwiGluTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SwiGluTest, MatchesCpuAndWorksInPlace) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t n = GetParam();
  const std::vector<float> gate = RandomVector(n, 8, -8.0f, 8.0f);
  const std::vector<float> up = RandomVector(n, 9, -2.0f, 2.0f);
  std::vector<float> want(static_cast<size_t>(n));
  kernels::cpu::SwiGlu(gate.data(), up.data(), n, want.data());

  DeviceBuffer<float> d_gate(gate), d_up(up), out(static_cast<size_t>(n));
  ASSERT_TRUE(SwiGlu(d_gate.get(), d_up.get(), n, out.get(), nullptr).ok());
  const std::vector<float> got = out.ToHost();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 1e-7) << i;
  }
  // In place over `gate`: the same values.
  ASSERT_TRUE(SwiGlu(d_gate.get(), d_up.get(), n, d_gate.get(), nullptr).ok());
  EXPECT_EQ(d_gate.ToHost(), got);
}

// Tiny, odd, and Llama-3.2-1B's intermediate size (8192) times 3 tokens.
INSTANTIATE_TEST_SUITE_P(Sizes, SwiGluTest, ::testing::Values(1, 1000, 3 * 8192));

// --- Embedding -----------------------------------------------------------------------------

struct EmbeddingCase {
  int64_t vocab;
  int64_t dim;
};

class EmbeddingTest : public ::testing::TestWithParam<std::tuple<EmbeddingCase, DType>> {};

TEST_P(EmbeddingTest, MatchesCpuExactly) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const auto [c, dtype] = GetParam();
  const Tensor table = MakeTensor(dtype, {c.vocab, c.dim}, RandomVector(c.vocab * c.dim, 10));
  const std::vector<int32_t> ids = {0, static_cast<int32_t>(c.vocab - 1), 3, 3, 1};
  std::vector<float> want(ids.size() * static_cast<size_t>(c.dim));
  ASSERT_TRUE(kernels::cpu::Embedding(table, ids, want.data()).ok());

  DeviceBuffer<uint8_t> d_table(Bytes(table));
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<int32_t> flag(std::vector<int32_t>{0});
  DeviceBuffer<float> out(want.size());
  ASSERT_TRUE(Embedding(d_table.get(), dtype, c.vocab, c.dim, d_ids.get(),
                        static_cast<int64_t>(ids.size()), out.get(), flag.get(), nullptr)
                  .ok());
  EXPECT_EQ(out.ToHost(), want);
  EXPECT_EQ(flag.ToHost()[0], 0);
}

TEST_P(EmbeddingTest, OutOfRangeIdsGiveZeroRowsAndSetTheFlag) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const auto [c, dtype] = GetParam();
  const Tensor table = MakeTensor(dtype, {c.vocab, c.dim}, RandomVector(c.vocab * c.dim, 11));
  const std::vector<int32_t> ids = {2, -1, static_cast<int32_t>(c.vocab)};
  std::vector<float> want(ids.size() * static_cast<size_t>(c.dim), 0.0f);
  // Row 0 as the CPU gives it; rows 1 and 2 (the bad ids) stay zero.
  ASSERT_TRUE(kernels::cpu::Embedding(table, {ids[0]}, want.data()).ok());
  EXPECT_FALSE(kernels::cpu::Embedding(table, ids, want.data() + c.dim).ok());
  std::fill(want.begin() + c.dim, want.end(), 0.0f);

  DeviceBuffer<uint8_t> d_table(Bytes(table));
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<int32_t> flag(std::vector<int32_t>{0});
  DeviceBuffer<float> out(std::vector<float>(want.size(), 7.0f));
  ASSERT_TRUE(Embedding(d_table.get(), dtype, c.vocab, c.dim, d_ids.get(),
                        static_cast<int64_t>(ids.size()), out.get(), flag.get(), nullptr)
                  .ok());
  EXPECT_EQ(out.ToHost(), want);
  EXPECT_EQ(flag.ToHost()[0], 1);
}

std::string EmbeddingName(const ::testing::TestParamInfo<EmbeddingTest::ParamType>& info) {
  const auto& [c, dtype] = info.param;
  return std::string(DTypeName(dtype)) + "_v" + std::to_string(c.vocab) + "_d" +
         std::to_string(c.dim);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingTest,
                         ::testing::Combine(::testing::Values(EmbeddingCase{10, 8},
                                                              EmbeddingCase{300, 2048}),
                                            ::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16)),
                         EmbeddingName);

// --- Argmax and sampling -------------------------------------------------------------------

// n_rows rows of `vocab` random logits; row r has its maximum at two indices (a tie) when
// vocab > 8, the lower of which is the expected winner.
std::vector<float> TiedLogits(int64_t n_rows, int64_t vocab, uint32_t seed) {
  std::vector<float> logits = RandomVector(n_rows * vocab, seed, -5.0f, 5.0f);
  if (vocab > 8) {
    for (int64_t r = 0; r < n_rows; ++r) {
      float* row = logits.data() + r * vocab;
      const int64_t a = (r * 7919 + 5) % vocab;
      const int64_t b = (r * 104729 + 3) % vocab;
      row[a] = 6.0f;
      row[b] = 6.0f;
    }
  }
  return logits;
}

std::vector<int32_t> CpuArgmax(const std::vector<float>& logits, int64_t n_rows, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < n_rows; ++r) {
    ids.push_back(Argmax(absl::MakeConstSpan(logits.data() + r * vocab, static_cast<size_t>(vocab))));
  }
  return ids;
}

class ArgmaxTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(ArgmaxTest, MatchesCpuArgmaxWithTies) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t vocab = GetParam();
  const int64_t n_rows = 5;
  std::vector<float> logits = TiedLogits(n_rows, vocab, 12);
  // Row 4: all zeros, the first one -0.0 (equal to +0.0): index 0 wins, as on the CPU.
  std::fill(logits.begin() + 4 * vocab, logits.end(), 0.0f);
  logits[static_cast<size_t>(4 * vocab)] = -0.0f;

  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> ids(static_cast<size_t>(n_rows));
  ASSERT_TRUE(ArgmaxRows(d_logits.get(), n_rows, vocab, ids.get(), nullptr).ok());
  EXPECT_EQ(ids.ToHost(), CpuArgmax(logits, n_rows, vocab));
}

// Tiny, Llama 2 (32000) and Llama 3 (128256) vocabularies.
INSTANTIATE_TEST_SUITE_P(Vocab, ArgmaxTest, ::testing::Values(1, 7, 1000, 32000, 128256));

// Runs SampleRows for `rows` over `logits` and returns the ids.
std::vector<int32_t> DeviceSample(const std::vector<float>& logits, int64_t vocab,
                                  const std::vector<DeviceSamplingRow>& rows) {
  const int64_t n_rows = static_cast<int64_t>(rows.size());
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<DeviceSamplingRow> scratch(rows.size());
  DeviceBuffer<int32_t> ids(rows.size());
  const absl::Status status =
      SampleRows(d_logits.get(), n_rows, vocab, rows, scratch.get(), ids.get(), nullptr);
  EXPECT_TRUE(status.ok()) << status;
  return ids.ToHost();
}

// The CPU Sampler's candidate order (logit descending, ties by index) and its top-k / top-p
// cut, with probabilities in double; `top_p_slack` widens the top-p cut.
std::vector<int32_t> CpuKeptSet(const float* logits, int64_t vocab, float temperature, int top_k,
                                float top_p, double top_p_slack) {
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (top_k > 0 && static_cast<size_t>(top_k) < keep) keep = static_cast<size_t>(top_k);
  std::vector<double> probs(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((static_cast<double>(logits[order[i]]) - logits[order[0]]) / temperature);
    total += probs[i];
  }
  double cumulative = 0.0;
  size_t n = 0;
  while (n < keep) {
    cumulative += probs[n++] / total;
    if (cumulative >= top_p + top_p_slack) break;
  }
  order.resize(n);
  return order;
}

TEST(SampleRowsTest, TemperatureZeroAndTopKOneAreArgmax) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t vocab = 128256, n_rows = 4;
  const std::vector<float> logits = TiedLogits(n_rows, vocab, 13);
  std::vector<DeviceSamplingRow> rows(n_rows);
  rows[0].temperature = 0.0f;
  rows[1].temperature = 0.0f;
  rows[1].top_k = 50;
  rows[1].top_p = 0.5f;
  rows[2].temperature = 1.0f;
  rows[2].top_k = 1;
  rows[3].temperature = 0.7f;
  rows[3].top_k = 1;
  rows[3].seed = 42;
  EXPECT_EQ(DeviceSample(logits, vocab, rows), CpuArgmax(logits, n_rows, vocab));

  // Greedy through the CPU Sampler gives the same token too.
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    SamplingParams params;
    params.temperature = 0.0f;
    Sampler sampler(params);
    EXPECT_EQ(sampler.Sample(absl::MakeSpan(row), {}, 0).id, CpuArgmax(logits, n_rows, vocab)[r]);
  }
}

TEST(SampleRowsTest, SameSeedAndStepGiveTheSameTokens) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t vocab = 1000, n_rows = 16;
  // Flat logits: every step's token is a fresh uniform draw.
  const std::vector<float> logits(static_cast<size_t>(n_rows * vocab), 0.0f);
  std::vector<DeviceSamplingRow> rows(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    rows[r].seed = 1234;  // one request's seed ...
    rows[r].step = static_cast<uint64_t>(r);  // ... over 16 steps
  }
  const std::vector<int32_t> first = DeviceSample(logits, vocab, rows);
  EXPECT_EQ(DeviceSample(logits, vocab, rows), first);
  // The steps draw different numbers: 16 equal tokens out of 1000 would be a broken stream.
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 1u);
  // Another seed, another stream.
  for (auto& row : rows) row.seed = 99;
  EXPECT_NE(DeviceSample(logits, vocab, rows), first);
}

struct FilterCase {
  float temperature;
  int top_k;
  float top_p;
};

class SampleFilterTest : public ::testing::TestWithParam<FilterCase> {};

TEST_P(SampleFilterTest, TokensLieInTheCpuKeptSet) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const FilterCase c = GetParam();
  const int64_t vocab = 128256, n_rows = 64;
  const std::vector<float> logits = RandomVector(n_rows * vocab, 14, -4.0f, 12.0f);
  std::vector<DeviceSamplingRow> rows(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    rows[r].temperature = c.temperature;
    rows[r].top_k = c.top_k;
    rows[r].top_p = c.top_p;
    rows[r].seed = static_cast<uint64_t>(r) * 31 + 7;
  }
  const std::vector<int32_t> ids = DeviceSample(logits, vocab, rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* row = logits.data() + r * vocab;
    const std::vector<int32_t> top_k =
        CpuKeptSet(row, vocab, c.temperature, c.top_k, /*top_p=*/1.0f, 0.0);
    const std::vector<int32_t> kept = CpuKeptSet(row, vocab, c.temperature, c.top_k, c.top_p, 1e-4);
    const int32_t id = ids[static_cast<size_t>(r)];
    EXPECT_NE(std::find(top_k.begin(), top_k.end(), id), top_k.end()) << "row " << r;
    EXPECT_NE(std::find(kept.begin(), kept.end(), id), kept.end()) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Filters, SampleFilterTest,
                         ::testing::Values(FilterCase{1.0f, 40, 1.0f}, FilterCase{0.8f, 0, 0.9f},
                                           FilterCase{1.3f, 100, 0.5f},
                                           FilterCase{0.5f, 5, 0.95f}));

struct DistributionCase {
  float temperature;
  int top_k;
  float top_p;
  std::vector<double> expected;  // probability of each of the 4 tokens
};

class SampleDistributionTest : public ::testing::TestWithParam<DistributionCase> {};

// Logits log(1), log(2), log(3), log(4): at temperature 1 the tokens have probabilities
// 0.1, 0.2, 0.3, 0.4. 4000 rows with 4000 seeds; each frequency within 0.03 of its probability.
TEST_P(SampleDistributionTest, FrequenciesMatchProbabilities) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const DistributionCase c = GetParam();
  const int64_t vocab = 4, n_rows = 4000;
  std::vector<float> logits;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int i = 0; i < vocab; ++i) logits.push_back(std::log(static_cast<float>(i + 1)));
  }
  std::vector<DeviceSamplingRow> rows(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    rows[r].temperature = c.temperature;
    rows[r].top_k = c.top_k;
    rows[r].top_p = c.top_p;
    rows[r].seed = static_cast<uint64_t>(r);
  }
  const std::vector<int32_t> ids = DeviceSample(logits, vocab, rows);
  std::vector<double> counts(vocab, 0.0);
  for (int32_t id : ids) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, vocab);
    counts[static_cast<size_t>(id)] += 1.0;
  }
  for (int i = 0; i < vocab; ++i) {
    EXPECT_NEAR(counts[static_cast<size_t>(i)] / n_rows, c.expected[static_cast<size_t>(i)], 0.03)
        << "token " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SampleDistributionTest,
    ::testing::Values(
        DistributionCase{1.0f, 0, 1.0f, {0.1, 0.2, 0.3, 0.4}},
        // T = 0.5 squares the probabilities: 1, 4, 9, 16 over 30.
        DistributionCase{0.5f, 0, 1.0f, {1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30}},
        // top-k 2 keeps tokens 3 and 2: 4/7, 3/7.
        DistributionCase{1.0f, 2, 1.0f, {0.0, 0.0, 3.0 / 7, 4.0 / 7}},
        // top-p 0.6: 0.4 < 0.6 <= 0.4 + 0.3, so tokens 3 and 2 again.
        DistributionCase{1.0f, 3, 0.6f, {0.0, 0.0, 3.0 / 7, 4.0 / 7}},
        // top-p 0.35: token 3 alone (0.4) reaches it.
        DistributionCase{1.0f, 0, 0.35f, {0.0, 0.0, 0.0, 1.0}}));

// --- Page copies -----------------------------------------------------------------------------

class PageCopyTest : public ::testing::TestWithParam<PageShape> {};

// A region of `num_pages` page-layers whose float i holds i (exact below 2^24).
std::vector<float> NumberedRegion(const PageShape& shape, int64_t num_pages, float offset) {
  std::vector<float> region(static_cast<size_t>(num_pages * shape.page_floats()));
  for (size_t i = 0; i < region.size(); ++i) region[i] = offset + static_cast<float>(i);
  return region;
}

// Float index of (page, kv, head, slot/dim offset `j`) in a region of `n_kv_heads` heads.
int64_t At(const PageShape& shape, int64_t n_kv_heads, int64_t page, int kv, int head,
           int64_t j) {
  return ((page * 2 + kv) * n_kv_heads + head) * shape.head_floats() + j;
}

TEST_P(PageCopyTest, CopyPagesCopiesWholePageLayers) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const PageShape shape = GetParam();
  const int64_t src_pages = 6, dst_pages = 5;
  const std::vector<float> src = NumberedRegion(shape, src_pages, 0.0f);
  const std::vector<int32_t> from = {4, 0, 5}, to = {1, 3, 0};

  std::vector<float> want(static_cast<size_t>(dst_pages * shape.page_floats()), -1.0f);
  for (size_t e = 0; e < from.size(); ++e) {
    std::copy_n(src.begin() + from[e] * shape.page_floats(), shape.page_floats(),
                want.begin() + to[e] * shape.page_floats());
  }
  DeviceBuffer<float> d_src(src);
  DeviceBuffer<float> d_dst(std::vector<float>(want.size(), -1.0f));
  DeviceBuffer<int32_t> d_from(from), d_to(to), flag(std::vector<int32_t>{0});
  ASSERT_TRUE(CopyPages(d_src.get(), src_pages, d_from.get(), d_dst.get(), dst_pages, d_to.get(),
                        static_cast<int64_t>(from.size()), shape, flag.get(), nullptr)
                  .ok());
  EXPECT_EQ(d_dst.ToHost(), want);
  EXPECT_EQ(flag.ToHost()[0], 0);
}

TEST_P(PageCopyTest, GatherThenScatterMovesAHeadRange) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const PageShape shape = GetParam();
  const int64_t num_pages = 6;
  const std::vector<int32_t> pages = {5, 2, 3};
  const int64_t n = static_cast<int64_t>(pages.size());
  // The whole head range, and the upper half (a TP split) when there are several heads.
  std::vector<std::pair<int, int>> ranges = {{0, shape.n_kv_heads}};
  if (shape.n_kv_heads > 1) ranges.push_back({shape.n_kv_heads / 2, shape.n_kv_heads / 2});
  const std::vector<float> region = NumberedRegion(shape, num_pages, 0.0f);
  DeviceBuffer<float> d_region(region);
  DeviceBuffer<int32_t> d_pages(pages);

  for (const auto& [first, count] : ranges) {
    SCOPED_TRACE("heads " + std::to_string(first) + " +" + std::to_string(count));
    std::vector<float> want_staging(static_cast<size_t>(n * 2 * count * shape.head_floats()));
    std::vector<float> want_region(region.size(), -1.0f);
    for (int64_t e = 0; e < n; ++e) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < count; ++h) {
          for (int64_t j = 0; j < shape.head_floats(); ++j) {
            const int64_t from = At(shape, shape.n_kv_heads, pages[e], kv, first + h, j);
            want_staging[static_cast<size_t>(At(shape, count, e, kv, h, j))] = region[from];
            want_region[static_cast<size_t>(from)] = region[from];
          }
        }
      }
    }
    DeviceBuffer<float> staging(want_staging.size());
    DeviceBuffer<int32_t> flag(std::vector<int32_t>{0});
    ASSERT_TRUE(GatherPages(d_region.get(), num_pages, shape, d_pages.get(), n, first, count,
                            staging.get(), flag.get(), nullptr)
                    .ok());
    EXPECT_EQ(staging.ToHost(), want_staging);

    // Scatter the staging buffer into a region of -1s: exactly the gathered slices come back.
    DeviceBuffer<float> target(std::vector<float>(region.size(), -1.0f));
    ASSERT_TRUE(ScatterPages(staging.get(), n, target.get(), num_pages, shape, d_pages.get(),
                             first, count, flag.get(), nullptr)
                    .ok());
    EXPECT_EQ(target.ToHost(), want_region);
    EXPECT_EQ(flag.ToHost()[0], 0);
  }
}

TEST_P(PageCopyTest, OutOfRangePageIdsAreSkippedAndFlagged) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const PageShape shape = GetParam();
  const int64_t num_pages = 3;
  const std::vector<float> src = NumberedRegion(shape, num_pages, 0.0f);
  const std::vector<int32_t> from = {1, 3, -1}, to = {2, 0, 1};
  std::vector<float> want(src.size(), -1.0f);
  std::copy_n(src.begin() + 1 * shape.page_floats(), shape.page_floats(),
              want.begin() + 2 * shape.page_floats());
  DeviceBuffer<float> d_src(src);
  DeviceBuffer<float> d_dst(std::vector<float>(src.size(), -1.0f));
  DeviceBuffer<int32_t> d_from(from), d_to(to), flag(std::vector<int32_t>{0});
  ASSERT_TRUE(CopyPages(d_src.get(), num_pages, d_from.get(), d_dst.get(), num_pages, d_to.get(),
                        3, shape, flag.get(), nullptr)
                  .ok());
  EXPECT_EQ(d_dst.ToHost(), want);
  EXPECT_EQ(flag.ToHost()[0], 1);
}

std::string PageName(const ::testing::TestParamInfo<PageShape>& info) {
  return absl::StrCat("h", info.param.n_kv_heads, "_b", info.param.block_size, "_d",
                      info.param.head_dim);
}

// Tiny; odd sizes (no 16-byte vectors); Llama-3.2-1B (8 KV heads, 16 slots, head_dim 64).
INSTANTIATE_TEST_SUITE_P(Shapes, PageCopyTest,
                         ::testing::Values(PageShape{2, 4, 8}, PageShape{3, 3, 5},
                                           PageShape{8, 16, 64}),
                         PageName);

// --- Argument checks (host only: no device needed) ------------------------------------------

TEST(ArgumentChecks, BadSizesAreInvalidArgument) {
  float* fake = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced: checks fail first
  int32_t* fake_ids = reinterpret_cast<int32_t*>(uintptr_t{256});
  const auto invalid = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(invalid(RmsNorm(fake, fake, DType::kInt4, 1, 8, 1e-5f, fake, nullptr)));
  EXPECT_TRUE(invalid(RmsNorm(fake, fake, DType::kF32, 1, 0, 1e-5f, fake, nullptr)));
  EXPECT_TRUE(invalid(RmsNorm(fake, fake, DType::kF32, -1, 8, 1e-5f, fake, nullptr)));
  EXPECT_TRUE(invalid(ResidualRmsNormSimilarity(fake, nullptr, fake, DType::kF32, 1, 8, 1e-5f,
                                                fake + 64, nullptr, nullptr)));
  EXPECT_TRUE(invalid(ResidualRmsNormSimilarity(fake, fake + 64, fake, DType::kF32, 1, 8, 1e-5f,
                                                fake, nullptr, nullptr)));
  EXPECT_TRUE(invalid(ApplyRope(fake, 2, fake, 1, 7, fake_ids, 1, fake, RopeStyle::kHalves,
                                nullptr)));
  EXPECT_TRUE(invalid(ApplyRope(fake, 2, nullptr, 1, 8, fake_ids, 1, fake, RopeStyle::kHalves,
                                nullptr)));
  EXPECT_TRUE(invalid(SwiGlu(fake, fake, -1, fake, nullptr)));
  EXPECT_TRUE(invalid(SwiGlu(fake, nullptr, 4, fake, nullptr)));
  EXPECT_TRUE(invalid(Embedding(fake, DType::kF32, 0, 8, fake_ids, 1, fake, nullptr, nullptr)));
  EXPECT_TRUE(invalid(ArgmaxRows(fake, 1, 0, fake_ids, nullptr)));

  DeviceSamplingRow bad;
  bad.top_p = 0.0f;
  auto* scratch = reinterpret_cast<DeviceSamplingRow*>(uintptr_t{256});
  EXPECT_TRUE(invalid(SampleRows(fake, 1, 8, {bad}, scratch, fake_ids, nullptr)));
  bad = DeviceSamplingRow{};
  bad.temperature = -1.0f;
  EXPECT_TRUE(invalid(SampleRows(fake, 1, 8, {bad}, scratch, fake_ids, nullptr)));
  bad = DeviceSamplingRow{};
  bad.top_k = -3;
  EXPECT_TRUE(invalid(SampleRows(fake, 1, 8, {bad}, scratch, fake_ids, nullptr)));
  EXPECT_TRUE(invalid(SampleRows(fake, 2, 8, {DeviceSamplingRow{}}, scratch, fake_ids, nullptr)));

  const PageShape shape{2, 4, 8};
  EXPECT_TRUE(invalid(CopyPages(fake, 4, fake_ids, fake, 4, fake_ids, 1, PageShape{0, 4, 8},
                                nullptr, nullptr)));
  EXPECT_TRUE(invalid(GatherPages(fake, 4, shape, fake_ids, 1, 1, 2, fake, nullptr, nullptr)));
  EXPECT_TRUE(invalid(ScatterPages(fake, 1, fake, 4, shape, fake_ids, -1, 1, nullptr, nullptr)));

  // Empty work is fine and launches nothing.
  EXPECT_TRUE(SwiGlu(nullptr, nullptr, 0, nullptr, nullptr).ok());
  EXPECT_TRUE(ArgmaxRows(nullptr, 0, 8, nullptr, nullptr).ok());
  EXPECT_TRUE(SampleRows(nullptr, 0, 8, {}, nullptr, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace estuary::cuda
