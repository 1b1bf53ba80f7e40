#include "kvtransfer/reshard.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace estuary::kvtransfer {
namespace {

// Pages of one layer on each rank: [rank][page bytes of num_pages pages].
using Shards = std::vector<std::vector<uint8_t>>;

Shards Apply(const ReshardShape& shape, int src_tp, int dst_tp, const Shards& src, int num_pages) {
  auto plan = PlanReshard(shape, src_tp, dst_tp);
  EXPECT_TRUE(plan.ok()) << plan.status();
  const int64_t src_page = PageLayerBytes(shape, src_tp);
  const int64_t dst_page = PageLayerBytes(shape, dst_tp);
  Shards dst(dst_tp, std::vector<uint8_t>(dst_page * num_pages, 0xEE));
  for (const RankPairPlan& pair : *plan) {
    for (int p = 0; p < num_pages; ++p) {
      for (const CopyChunk& c : pair.chunks) {
        EXPECT_LE(c.src_offset + c.bytes, src_page);
        EXPECT_LE(c.dst_offset + c.bytes, dst_page);
        std::memcpy(dst[pair.dst_rank].data() + p * dst_page + c.dst_offset,
                    src[pair.src_rank].data() + p * src_page + c.src_offset, c.bytes);
      }
    }
  }
  return dst;
}

// The reference: element (page, k_or_v, head, slot, dim) of the whole model, sliced by rank.
Shards MakeShards(const ReshardShape& shape, int tp, int num_pages) {
  const int local = shape.n_kv_heads / tp;
  Shards out(tp);
  for (int r = 0; r < tp; ++r) {
    for (int p = 0; p < num_pages; ++p) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < local; ++h) {
          for (int s = 0; s < shape.block_size; ++s) {
            for (int d = 0; d < shape.head_dim; ++d) {
              // A value unique to (page, K|V, global head, slot, dim), dtype_bytes wide.
              const uint32_t v = static_cast<uint32_t>(
                  (((p * 2 + kv) * shape.n_kv_heads + r * local + h) * shape.block_size + s) *
                      shape.head_dim + d);
              for (int i = 0; i < shape.dtype_bytes; ++i) {
                out[r].push_back(static_cast<uint8_t>(i < 4 ? v >> (8 * i) : 0));
              }
            }
          }
        }
      }
    }
  }
  return out;
}

TEST(ReshardTest, SameTpIsOneWholePageCopyPerRank) {
  ReshardShape shape{8, 64, 16, 4};
  auto plan = PlanReshard(shape, 2, 2);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((*plan)[r].src_rank, r);
    EXPECT_EQ((*plan)[r].dst_rank, r);
    ASSERT_EQ((*plan)[r].chunks.size(), 1u);
    EXPECT_EQ((*plan)[r].chunks[0], (CopyChunk{0, 0, PageLayerBytes(shape, 2)}));
  }
}

TEST(ReshardTest, Tp1ToTp2SplitsKAndV) {
  ReshardShape shape{8, 64, 16, 4};
  const int64_t head = 16 * 64 * 4;
  auto plan = PlanReshard(shape, 1, 2);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 2u);
  // Rank 1 gets heads 4..7: K at 4 heads into src K, V at 8 + 4 heads.
  EXPECT_EQ((*plan)[1].chunks,
            (std::vector<CopyChunk>{{4 * head, 0, 4 * head}, {12 * head, 4 * head, 4 * head}}));
  EXPECT_EQ((*plan)[0].chunks,
            (std::vector<CopyChunk>{{0, 0, 4 * head}, {8 * head, 4 * head, 4 * head}}));
}

TEST(ReshardTest, RoundTripsThroughEveryTpPairByteExact) {
  for (ReshardShape shape : {ReshardShape{8, 64, 16, 4}, ReshardShape{4, 8, 4, 4},
                             ReshardShape{12, 16, 2, 2}}) {
    const int num_pages = 3;
    for (int a : {1, 2, 3, 4}) {
      for (int b : {1, 2, 3, 4}) {
        if (shape.n_kv_heads % a != 0 || shape.n_kv_heads % b != 0) continue;
        SCOPED_TRACE(::testing::Message() << "H=" << shape.n_kv_heads << " " << a << "->" << b);
        const Shards src = MakeShards(shape, a, num_pages);
        const Shards mid = Apply(shape, a, b, src, num_pages);
        EXPECT_EQ(mid, MakeShards(shape, b, num_pages));
        EXPECT_EQ(Apply(shape, b, a, mid, num_pages), src);
        // Every destination byte is written exactly once.
        auto plan = PlanReshard(shape, a, b);
        ASSERT_TRUE(plan.ok());
        std::vector<int64_t> written(b, 0);
        for (const auto& pair : *plan) {
          for (const auto& c : pair.chunks) written[pair.dst_rank] += c.bytes;
        }
        for (int r = 0; r < b; ++r) EXPECT_EQ(written[r], PageLayerBytes(shape, b));
      }
    }
  }
}

TEST(ReshardTest, RejectsHeadsThatDoNotDivide) {
  auto plan = PlanReshard(ReshardShape{6, 64, 16, 4}, 1, 4);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("6 KV heads"), std::string::npos);
  EXPECT_FALSE(PlanReshard(ReshardShape{8, 0, 16, 4}, 1, 2).ok());
  EXPECT_FALSE(PlanReshard(ReshardShape{8, 64, 16, 4}, 0, 2).ok());
}

}  // namespace
}  // namespace estuary::kvtransfer
