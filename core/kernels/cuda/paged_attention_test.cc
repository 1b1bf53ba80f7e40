// GPU tests (CTest label `gpu`) of paged-attention decode against the CPU PagedAttention
// (core/kvcache/paged_attention.h) on a KvPool whose layer region is copied to the device; they
// skip without a device. Tolerance: 1e-4 absolute (q, K, V uniform in [-1, 1]).
#include "core/kernels/cuda/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/kernels/cuda/matmul_test_util.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/paged_attention.h"
#include "gtest/gtest.h"

namespace estuary::cuda {
namespace {

using matmul_test::DeviceArray;
using matmul_test::HasCudaDevice;

struct AttnCase {
  std::string name;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  std::vector<int> seq_lens;
  int split_positions = 0;  // 0: one pass
};

std::vector<AttnCase> Cases() {
  std::vector<AttnCase> base = {
      {"Tiny", 4, 2, 32, 4, {1, 5, 17, 0}},
      {"OddHeadDim", 6, 3, 40, 16, {3, 50}},
      {"MhaHeadDim256", 2, 2, 256, 8, {33, 7}},
      {"Llama1B", 32, 8, 64, 16, {1, 37, 500, 2048}},
      {"Llama1BBatch", 32, 8, 64, 16, {12, 300, 64, 65, 1, 129, 250, 16}},
      {"HeadDim128", 32, 8, 128, 16, {1000, 129}},
  };
  std::vector<AttnCase> cases;
  for (const AttnCase& c : base) {
    for (int split : {0, 1, 8, 64}) {
      AttnCase s = c;
      s.split_positions = split;
      s.name = absl::StrCat(c.name, "_split", split);
      cases.push_back(s);
    }
  }
  return cases;
}

class CudaPagedAttentionTest : public testing::TestWithParam<AttnCase> {};

TEST_P(CudaPagedAttentionTest, MatchesCpuPagedAttention) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const AttnCase& c = GetParam();
  const int n_seq = static_cast<int>(c.seq_lens.size());
  const int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  constexpr int kLayer = 1;  // of 2, so that the layer region is not the pool's first

  KvLayout layout;
  layout.n_layers = 2;
  layout.n_kv_heads = c.n_kv_heads;
  layout.head_dim = c.head_dim;
  layout.block_size = c.block_size;
  std::vector<int> n_pages(static_cast<size_t>(n_seq));
  int total_pages = 0;
  for (int i = 0; i < n_seq; ++i) {
    n_pages[static_cast<size_t>(i)] = (c.seq_lens[static_cast<size_t>(i)] + c.block_size - 1) /
                                      c.block_size;
    total_pages += n_pages[static_cast<size_t>(i)];
  }
  absl::StatusOr<std::unique_ptr<KvPool>> pool =
      KvPool::Create(layout, int64_t{total_pages + 3} * layout.page_bytes());
  ASSERT_TRUE(pool.ok()) << pool.status();

  // Pages in shuffled order, so that a sequence's pages are neither ascending nor adjacent.
  absl::StatusOr<std::vector<int32_t>> ids = (*pool)->Allocate(total_pages + 3);
  ASSERT_TRUE(ids.ok()) << ids.status();
  std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 7 + n_seq));
  std::shuffle(ids->begin(), ids->end(), rng);
  const int stride = (max_len + c.block_size - 1) / c.block_size + 1;
  std::vector<int32_t> table(static_cast<size_t>(n_seq * stride), -1);  // unused entries: -1
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(n_seq));
  size_t next = 0;
  for (int i = 0; i < n_seq; ++i) {
    for (int p = 0; p < n_pages[static_cast<size_t>(i)]; ++p) {
      pages[static_cast<size_t>(i)].push_back((*ids)[next]);
      table[static_cast<size_t>(i * stride + p)] = (*ids)[next++];
    }
  }

  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int layer = 0; layer < 2; ++layer) {
    const KvRegion region = (*pool)->layer_region(layer);
    float* data = static_cast<float*>(region.data);
    for (size_t i = 0; i < region.bytes / sizeof(float); ++i) data[i] = uniform(rng);
  }
  const KvRegion region = (*pool)->layer_region(kLayer);
  const float* layer_data = static_cast<const float*>(region.data);
  std::vector<float> kv(layer_data, layer_data + region.bytes / sizeof(float));
  const size_t q_size = static_cast<size_t>(n_seq) * c.n_heads * c.head_dim;
  std::vector<float> q(q_size);
  for (float& v : q) v = uniform(rng);

  // CPU reference: the decode step of each sequence (query at position len - 1).
  std::vector<float> ref(q_size, 0.0f);
  const size_t row = static_cast<size_t>(c.n_heads) * c.head_dim;
  for (int i = 0; i < n_seq; ++i) {
    const int len = c.seq_lens[static_cast<size_t>(i)];
    if (len == 0) continue;  // the GPU writes zeros
    PagedAttention(q.data() + i * row, 1, len - 1, **pool, pages[static_cast<size_t>(i)], kLayer,
                   c.n_heads, ref.data() + i * row);
  }

  DeviceArray<float> d_q(q);
  DeviceArray<float> d_kv(kv);
  DeviceArray<int32_t> d_table(table);
  DeviceArray<int32_t> d_lens(std::vector<int32_t>(c.seq_lens.begin(), c.seq_lens.end()));
  DeviceArray<float> d_out(std::vector<float>(q_size, NAN));

  PagedAttentionDecodeArgs args;
  args.q = d_q.get();
  args.kv_layer = d_kv.get();
  args.page_stride = 0;  // KvPool's: 2 * n_kv_heads * block_size * head_dim
  args.page_table = d_table.get();
  args.page_table_stride = stride;
  args.seq_lens = d_lens.get();
  args.n_seq = n_seq;
  args.n_heads = c.n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = c.head_dim;
  args.block_size = c.block_size;
  args.max_seq_len = max_len;
  args.out = d_out.get();
  args.split_positions = c.split_positions;
  const size_t ws_bytes = PagedAttentionDecodeWorkspaceBytes(args);
  DeviceArray<uint8_t> d_ws(std::max<size_t>(ws_bytes, 1));
  args.workspace = d_ws.get();
  args.workspace_bytes = ws_bytes;
  ASSERT_TRUE(PagedAttentionDecode(args, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = d_out.Download();

  int failures = 0;
  for (size_t i = 0; i < q_size; ++i) {
    if (!(std::fabs(out[i] - ref[i]) <= 1e-4f) && ++failures <= 10) {
      ADD_FAILURE() << "seq " << i / row << " head " << (i % row) / c.head_dim << " dim "
                    << i % c.head_dim << ": gpu=" << out[i] << " cpu=" << ref[i];
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaPagedAttentionTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<AttnCase>& info) {
                           return info.param.name;
                         });

// Argument checks run before any CUDA call, so they need no device.
TEST(CudaPagedAttentionArgsTest, RejectsBadArguments) {
  float dummy[4] = {};
  int32_t ids[4] = {};
  PagedAttentionDecodeArgs a;
  a.q = dummy;
  a.kv_layer = dummy;
  a.page_table = ids;
  a.page_table_stride = 4;
  a.seq_lens = ids;
  a.n_seq = 1;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 64;
  a.block_size = 16;
  a.max_seq_len = 64;
  a.out = dummy;

  PagedAttentionDecodeArgs bad = a;
  bad.head_dim = 512;
  EXPECT_EQ(PagedAttentionDecode(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.n_kv_heads = 3;
  EXPECT_EQ(PagedAttentionDecode(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.page_table_stride = 3;  // 64 positions need 4 pages
  EXPECT_EQ(PagedAttentionDecode(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.q = nullptr;
  EXPECT_EQ(PagedAttentionDecode(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.split_positions = 16;  // splits without a workspace
  EXPECT_GT(PagedAttentionDecodeWorkspaceBytes(bad), 0u);
  EXPECT_EQ(PagedAttentionDecode(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.n_seq = 0;  // nothing to do
  EXPECT_TRUE(PagedAttentionDecode(bad, nullptr).ok());
  EXPECT_EQ(PagedAttentionDecodeWorkspaceBytes(a), 0u);  // one pass
}

}  // namespace
}  // namespace estuary::cuda
