// Int4MatMul: int4 weights (Int4Matrix layout, see int4_matrix.h) × f32 activations, Highway
// runtime dispatch.
//
// Unpacking without shifts: u32 word j of a block holds column 16k + j in bits [4k, 4k+4). Masking
// bits [4k, 4k+4) and converting the int32 gives q · 2^(4k) exactly, so x is copied once per call
// pre-multiplied by 2^(-4k) for the columns of slice k (exact: powers of two). The top nibble is
// taken by one logical shift (q itself, x unscaled). One slice of 16 weights then costs one
// integer op, one int→float conversion and one FMA per 16 lanes (two of each on AVX2).
//
// Group parameters: y = Σ_g s_g Σ_{i∈g} q_i x_i + Σ_g m_g X_g, X_g = Σ_{i∈g} x_i computed once per
// call. The GEMV keeps one accumulator per row and group and folds it in with one FMA by s_g per
// group; the GEMM multiplies each unpacked slice by s_g once and shares it across the tokens.
// Both multiply by the matrix's param_multiplier at the end.
//
// Memory order: one 4-row tile at a time (its f16 parameters, then its nibbles: one linear
// stream over the whole matrix); within a tile, block by block, the 4 rows of a block together.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/quant/int4_matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must follow foreach_target.h.
#include "hwy/highway.h"

#ifndef ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE
#define ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/quant/int4_matmul.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/half_float.h"
#include "hwy/aligned_allocator.h"

namespace estuary::int4_kernel {

constexpr int64_t kTileRows = Int4Matrix::kTileRows;
constexpr int64_t kBlockCols = Int4Matrix::kBlockCols;
constexpr int64_t kSliceCols = Int4Matrix::kSliceCols;

// Inputs prepared once per call and shared, read-only, by every tile.
struct Prepared {
  const float* xs = nullptr;    // [n_tokens][padded_cols]: x scaled by 2^(-4k) per slice k
  const float* xsum = nullptr;  // [n_tokens][padded_groups]: Σ of x over each group
  int64_t n_tokens = 0;
  int64_t padded_cols = 0;    // n_blocks * 128
  int64_t padded_groups = 0;  // >= n_groups and >= every group index a padded slice maps to
};

// Thread-local growable f32 scratch, one per `slot`.
inline float* Scratch(int slot, size_t n) {
  thread_local hwy::AlignedFreeUniquePtr<float[]> buffers[2];
  thread_local size_t capacity[2] = {0, 0};
  if (n > capacity[slot]) {
    buffers[slot] = hwy::AllocateAligned<float>(n);
    capacity[slot] = n;
  }
  return buffers[slot].get();
}

}  // namespace estuary::int4_kernel
#endif  // ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE

HWY_BEFORE_NAMESPACE();
namespace estuary::int4_kernel {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;  // a slice is 16 columns: 1, 2, 4 or 16 vectors
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;
constexpr size_t kN = hn::MaxLanes(DF());
constexpr size_t kVecsPerSlice = kSliceCols / kN;

// Slice k of a u32 vector as f32: q · 2^(4k) (k < 7) or q (k == 7).
template <int k>
HWY_INLINE VF Unpack(VU w) {
  const DF df;
  const DU du;
  const DI di;
  if constexpr (k == 7) {
    return hn::ConvertTo(df, hn::BitCast(di, hn::ShiftRight<28>(w)));
  } else {
    return hn::ConvertTo(df, hn::BitCast(di, hn::And(w, hn::Set(du, 0xFu << (4 * k)))));
  }
}

// f16 parameters of one tile to f32: out[p * padded_groups + g] for p in 0..7 (scales of rows
// 0..3, then offsets of rows 0..3), zero beyond n_groups.
void LoadTileParams(const Int4Matrix& w, int64_t tile, int64_t padded_groups, float* out) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t n_groups = w.n_groups();
  const uint16_t* src = w.tile_scales(tile);  // scales then offsets, [8][n_groups]
  for (int64_t p = 0; p < 2 * kTileRows; ++p) {
    const uint16_t* in = src + p * n_groups;
    float* dst = out + p * padded_groups;
    int64_t g = 0;
    for (; g + static_cast<int64_t>(kN) <= n_groups; g += kN) {
      const auto h = hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(in + g));
      hn::Store(hn::PromoteTo(df, h), df, dst + g);
    }
    for (; g < n_groups; ++g) dst[g] = F16ToF32(in[g]);
    for (; g < padded_groups; ++g) dst[g] = 0.0f;
  }
}

// Σ_g a[g] * b[g] over n (a multiple of 16) aligned floats.
HWY_INLINE float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const DF df;
  VF acc = hn::Zero(df);
  for (int64_t i = 0; i < n; i += kN) {
    acc = hn::MulAdd(hn::Load(df, a + i), hn::Load(df, b + i), acc);
  }
  return hn::GetLane(hn::SumOfLanes(df, acc));
}

// ---- GEMV (one token) ----------------------------------------------------------------------
// kR rows of a tile side by side (4 on AVX-512; 2 where 16 columns take two vectors, so that
// the unpacked words stay in registers). Every load of x serves the kR rows, and the kR group
// accumulators are independent FMA chains.
constexpr int kGemvRows = kVecsPerSlice == 1 ? 4 : 2;

// Slice k of one block for kR rows: accumulate into the group accumulators g[r]; at the end of
// a group (every kS slices; with kS == 8 only when `flush` says the group ends with this block)
// fold them into acc[r] with the rows' group scales.
template <int kR, int kS, int k>
HWY_INLINE void GemvSlice(const VU (&w)[kR][kVecsPerSlice], const float* HWY_RESTRICT xb,
                          const float* HWY_RESTRICT scales, int64_t scale_stride, int64_t g0,
                          bool flush, VF (&acc)[kR], VF (&g)[kR]) {
  const DF df;
  HWY_UNROLL(4)
  for (size_t v = 0; v < kVecsPerSlice; ++v) {
    const VF xv = hn::Load(df, xb + k * kSliceCols + v * kN);
    HWY_UNROLL(4)
    for (int r = 0; r < kR; ++r) g[r] = hn::MulAdd(Unpack<k>(w[r][v]), xv, g[r]);
  }
  if constexpr ((k + 1) % kS == 0) {
    if (kS < 8 || flush) {
      HWY_UNROLL(4)
      for (int r = 0; r < kR; ++r) {
        acc[r] = hn::MulAdd(g[r], hn::Set(df, scales[r * scale_stride + g0 + k / kS]), acc[r]);
        g[r] = hn::Zero(df);
      }
    }
  }
}

template <int kR, int kS, size_t... K>
HWY_INLINE void GemvBlock(std::index_sequence<K...>, const uint32_t* HWY_RESTRICT words,
                          const float* HWY_RESTRICT xb, const float* HWY_RESTRICT scales,
                          int64_t scale_stride, int64_t g0, bool flush, VF (&acc)[kR],
                          VF (&g)[kR]) {
  const DU du;
  VU w[kR][kVecsPerSlice];
  HWY_UNROLL(4)
  for (int r = 0; r < kR; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < kVecsPerSlice; ++v) w[r][v] = hn::Load(du, words + r * 16 + v * kN);
  }
  (GemvSlice<kR, kS, static_cast<int>(K)>(w, xb, scales, scale_stride, g0, flush, acc, g), ...);
}

// kR rows (from `words`, the first row's words of block 0; `scales` its first scale), one
// token. kS = slices per group (1, 2, 4; 8 for groups of >= 128 columns, which span
// blocks_per_group blocks). Writes the dot products without the offset term.
template <int kR, int kS>
HWY_NOINLINE void GemvRows(const uint32_t* HWY_RESTRICT words, const float* HWY_RESTRICT scales,
                           int64_t scale_stride, const float* HWY_RESTRICT xs, int64_t n_blocks,
                           int64_t blocks_per_group, float* dots) {
  const DF df;
  const std::make_index_sequence<8> slices;
  VF acc[kR];
  VF g[kR];
  for (int r = 0; r < kR; ++r) {
    acc[r] = hn::Zero(df);
    g[r] = hn::Zero(df);
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t g0 = kS < 8 ? b * (8 / kS) : b / blocks_per_group;
    const bool flush = kS < 8 || (b + 1) % blocks_per_group == 0 || b + 1 == n_blocks;
    GemvBlock<kR, kS>(slices, words + b * kTileRows * 16, xs + b * kBlockCols, scales,
                      scale_stride, g0, flush, acc, g);
  }
  for (int r = 0; r < kR; ++r) dots[r] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
}

template <int kS>
HWY_INLINE void GemvTile(const uint32_t* HWY_RESTRICT nibbles, const float* HWY_RESTRICT params,
                         const float* HWY_RESTRICT xs, int64_t n_blocks,
                         int64_t blocks_per_group, int64_t padded_groups, float* dots) {
  for (int r = 0; r < kTileRows; r += kGemvRows) {
    GemvRows<kGemvRows, kS>(nibbles + r * 16, params + r * padded_groups, padded_groups, xs,
                            n_blocks, blocks_per_group, dots + r);
  }
}

// ---- GEMM (2..32 tokens, in chunks of up to kGemmTokens) ---------------------------------------
// kR rows × kT tokens of accumulators; each unpacked slice is multiplied by its group scale once
// and serves kT tokens, each load of x serves kR rows.
constexpr int kGemmRows = kVecsPerSlice == 1 ? 4 : 2;
constexpr int kGemmTokens = 4;

template <int kR, int kT, int k>
HWY_INLINE void GemmSlice(const VU (&w)[kR][kVecsPerSlice], const float* HWY_RESTRICT xb,
                          int64_t x_stride, const float* HWY_RESTRICT scales,
                          int64_t scale_stride, int64_t group, VF (&acc)[kR][kT]) {
  const DF df;
  HWY_UNROLL(4)
  for (size_t v = 0; v < kVecsPerSlice; ++v) {
    VF d[kR];
    HWY_UNROLL(4)
    for (int r = 0; r < kR; ++r) {
      d[r] = hn::Mul(Unpack<k>(w[r][v]), hn::Set(df, scales[r * scale_stride + group]));
    }
    const float* xk = xb + k * kSliceCols + v * kN;
    HWY_UNROLL(8)
    for (int t = 0; t < kT; ++t) {
      const VF xv = hn::Load(df, xk + t * x_stride);
      HWY_UNROLL(4)
      for (int r = 0; r < kR; ++r) acc[r][t] = hn::MulAdd(d[r], xv, acc[r][t]);
    }
  }
}

template <int kR, int kT, size_t... K>
HWY_INLINE void GemmBlock(std::index_sequence<K...>, const uint32_t* HWY_RESTRICT words,
                          const float* HWY_RESTRICT xb, int64_t x_stride,
                          const float* HWY_RESTRICT scales, int64_t scale_stride, int64_t col0,
                          int group_shift, VF (&acc)[kR][kT]) {
  const DU du;
  VU w[kR][kVecsPerSlice];
  HWY_UNROLL(4)
  for (int r = 0; r < kR; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < kVecsPerSlice; ++v) w[r][v] = hn::Load(du, words + r * 16 + v * kN);
  }
  (GemmSlice<kR, kT, static_cast<int>(K)>(
       w, xb, x_stride, scales, scale_stride,
       (col0 + static_cast<int64_t>(K) * kSliceCols) >> group_shift, acc),
   ...);
}

// kR rows × kT tokens (x rows at xs + t * x_stride): the dot products without the offset term,
// into dots[r * kGemmTokens + t].
template <int kR, int kT>
HWY_NOINLINE void GemmRows(const uint32_t* HWY_RESTRICT words, const float* HWY_RESTRICT scales,
                           int64_t scale_stride, const float* HWY_RESTRICT xs, int64_t x_stride,
                           int64_t n_blocks, int group_shift, float* dots) {
  const DF df;
  const std::make_index_sequence<8> slices;
  VF acc[kR][kT];
  for (int r = 0; r < kR; ++r) {
    for (int t = 0; t < kT; ++t) acc[r][t] = hn::Zero(df);
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    GemmBlock<kR, kT>(slices, words + b * kTileRows * 16, xs + b * kBlockCols, x_stride, scales,
                      scale_stride, b * kBlockCols, group_shift, acc);
  }
  for (int r = 0; r < kR; ++r) {
    for (int t = 0; t < kT; ++t) {
      dots[r * kGemmTokens + t] = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
    }
  }
}

using GemmRowsFn = void (*)(const uint32_t*, const float*, int64_t, const float*, int64_t,
                            int64_t, int, float*);
constexpr GemmRowsFn kGemmRowsFns[kGemmTokens + 1] = {
    nullptr, &GemmRows<kGemmRows, 1>, &GemmRows<kGemmRows, 2>, &GemmRows<kGemmRows, 3>,
    &GemmRows<kGemmRows, 4>};

int Log2(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

// Tiles [tile_begin, tile_end) of y = W x for all tokens.
void TilesImpl(const Int4Matrix& w, const Prepared& p, int64_t tile_begin, int64_t tile_end,
               float* y) {
  const int64_t rows = w.rows();
  const int64_t n_blocks = w.n_blocks();
  const int64_t group = w.group_size();
  const int64_t pg = p.padded_groups;
  const float mult = w.param_multiplier();
  float* params = Scratch(0, static_cast<size_t>(2 * kTileRows * pg));
  const float* offsets = params + kTileRows * pg;
  float dots[kTileRows * kGemmTokens];
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    LoadTileParams(w, tile, pg, params);
    const uint32_t* nibbles = w.tile_nibbles(tile);
    const int64_t row0 = tile * kTileRows;
    const int64_t live = std::min<int64_t>(kTileRows, rows - row0);
    if (p.n_tokens == 1) {
      switch (group) {
        case 16:
          GemvTile<1>(nibbles, params, p.xs, n_blocks, 1, pg, dots);
          break;
        case 32:
          GemvTile<2>(nibbles, params, p.xs, n_blocks, 1, pg, dots);
          break;
        case 64:
          GemvTile<4>(nibbles, params, p.xs, n_blocks, 1, pg, dots);
          break;
        default:
          GemvTile<8>(nibbles, params, p.xs, n_blocks, group / kBlockCols, pg, dots);
          break;
      }
      for (int64_t r = 0; r < live; ++r) {
        y[row0 + r] = mult * (dots[r] + Dot(offsets + r * pg, p.xsum, pg));
      }
      continue;
    }
    const int shift = Log2(group);
    for (int64_t t0 = 0; t0 < p.n_tokens; t0 += kGemmTokens) {
      const int chunk = static_cast<int>(std::min<int64_t>(kGemmTokens, p.n_tokens - t0));
      for (int64_t r0 = 0; r0 < live; r0 += kGemmRows) {
        kGemmRowsFns[chunk](nibbles + r0 * 16, params + r0 * pg, pg, p.xs + t0 * p.padded_cols,
                            p.padded_cols, n_blocks, shift, dots);
        for (int64_t r = r0; r < std::min<int64_t>(live, r0 + kGemmRows); ++r) {
          for (int t = 0; t < chunk; ++t) {
            const float* xsum = p.xsum + (t0 + t) * pg;
            y[(t0 + t) * rows + row0 + r] =
                mult * (dots[(r - r0) * kGemmTokens + t] + Dot(offsets + r * pg, xsum, pg));
          }
        }
      }
    }
  }
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::int4_kernel
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary {
namespace int4_kernel {

HWY_EXPORT(TilesImpl);
HWY_EXPORT(TargetNameImpl);

namespace {

// x scaled per slice (2^(-4k) for k < 7, 1 for k == 7), zero-padded to whole blocks; and the
// per-group sums of x. Both in the caller's thread-local scratch.
Prepared Prepare(const Int4Matrix& w, const float* x, int64_t n_tokens) {
  Prepared p;
  const int64_t cols = w.cols();
  const int64_t group = w.group_size();
  p.n_tokens = n_tokens;
  p.padded_cols = w.n_blocks() * kBlockCols;
  p.padded_groups = (std::max(w.n_groups(), p.padded_cols / group) + 15) / 16 * 16;
  float* xs = Scratch(1, static_cast<size_t>(n_tokens * (p.padded_cols + p.padded_groups)));
  float* xsum = xs + n_tokens * p.padded_cols;
  static constexpr float kSliceScale[8] = {1.0f,   0x1p-4f,  0x1p-8f,  0x1p-12f,
                                           0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * cols;
    float* st = xs + t * p.padded_cols;
    for (int64_t c = 0; c < cols; ++c) st[c] = xt[c] * kSliceScale[(c % kBlockCols) / kSliceCols];
    for (int64_t c = cols; c < p.padded_cols; ++c) st[c] = 0.0f;
    float* sums = xsum + t * p.padded_groups;
    for (int64_t g = 0; g < p.padded_groups; ++g) {
      float sum = 0.0f;
      const int64_t end = std::min(cols, (g + 1) * group);
      for (int64_t c = g * group; c < end; ++c) sum += xt[c];
      sums[g] = sum;
    }
  }
  p.xs = xs;
  p.xsum = xsum;
  return p;
}

// Process-wide pool: workers wait for a job and run their share of its tiles. Jobs are
// serialized by `run_mutex_`; the caller takes part as worker 0.
class TilePool {
 public:
  static TilePool& Get() {
    static TilePool* pool = new TilePool();  // never destroyed: workers may outlive main()
    return *pool;
  }

  // Runs fn(begin, end) over [0, n) split into `threads` contiguous parts.
  void Run(int threads, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    Grow(threads - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      job_n_ = n;
      job_parts_ = threads;
      pending_ = threads - 1;
      ++generation_;
    }
    wake_.notify_all();
    RunPart(0, fn, n, threads);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  static void RunPart(int part, const std::function<void(int64_t, int64_t)>& fn, int64_t n,
                      int parts) {
    const int64_t begin = n * part / parts;
    const int64_t end = n * (part + 1) / parts;
    if (begin < end) fn(begin, end);
  }

  void Grow(int workers) {
    while (static_cast<int>(workers_.size()) < workers) {
      const int part = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, part] { WorkerLoop(part); });
    }
  }

  void WorkerLoop(int part) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)>* job;
      int64_t n;
      int parts;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (part >= job_parts_) continue;  // not needed for this job
        job = job_;
        n = job_n_;
        parts = job_parts_;
      }
      RunPart(part, *job, n, parts);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace
}  // namespace int4_kernel

void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y) {
  Int4MatMul(w, x, n_tokens, y, 1);
}

void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, int threads) {
  if (w.empty() || n_tokens <= 0) return;
  const int4_kernel::Prepared p = int4_kernel::Prepare(w, x, n_tokens);
  const int64_t tiles = w.n_tiles();
  const int parts = static_cast<int>(std::clamp<int64_t>(threads, 1, tiles));
  if (parts == 1) {
    HWY_DYNAMIC_DISPATCH(int4_kernel::TilesImpl)(w, p, 0, tiles, y);
    return;
  }
  int4_kernel::TilePool::Get().Run(parts, tiles, [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(int4_kernel::TilesImpl)(w, p, begin, end, y);
  });
}

const char* Int4MatMulTargetName() {
  return HWY_DYNAMIC_DISPATCH(int4_kernel::TargetNameImpl)();
}

}  // namespace estuary
#endif  // HWY_ONCE
