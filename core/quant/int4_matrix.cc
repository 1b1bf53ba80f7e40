// Int4Matrix: layout, quantization driver (threads, per-tile packing) and element access.

#include "core/quant/int4_matrix.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/streamed_memory.h"
#include "core/quant/int4_matmul.h"
#include "core/quant/quantize_internal.h"
#include "core/tensor/half_float.h"

namespace estuary {
namespace {

using quant_internal::GroupParams;
using quant_internal::StoredParams;

constexpr int64_t kTileRows = Int4Matrix::kTileRows;
constexpr int64_t kBlockCols = Int4Matrix::kBlockCols;
constexpr int64_t kSliceCols = Int4Matrix::kSliceCols;
constexpr int64_t kBlockBytes = Int4Matrix::kBlockBytes;
constexpr int64_t kPanelCols = Int4Matrix::kPanelCols;
using Panel = Int4Matrix::Panel;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// IEEE f16 bits to f32 by one multiply (exact for normals and subnormals; inputs are finite
// or rejected later as non-finite f32).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7fffu;
  uint32_t bits = magnitude << 13;
  float f;
  if (magnitude >= 0x7c00u) {
    bits |= 0x7f800000u;  // inf / NaN
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  std::memcpy(&f, &bits, 4);
  f *= 0x1p112f;
  return sign ? -f : f;
}

// Row `r` of a [rows][cols] f32/bf16/f16 tensor as f32.
void RowToF32(const Tensor& weight, int64_t r, float* out) {
  const int64_t cols = weight.dim(1);
  switch (weight.dtype()) {
    case DType::kF32:
      std::memcpy(out, weight.data<float>() + r * cols, static_cast<size_t>(cols) * 4);
      return;
    case DType::kBF16: {
      const uint16_t* row = weight.data<uint16_t>() + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = Bf16ToF32(row[c]);
      return;
    }
    case DType::kF16: {
      const uint16_t* row = weight.data<uint16_t>() + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = HalfToFloat(row[c]);
      return;
    }
    case DType::kInt4:
      return;
  }
}

// Runs fn(worker, i) for i in [0, n) on `threads` threads (worker in [0, threads)), handing out
// indices one at a time. Runs inline when threads <= 1.
void ParallelFor(int threads, int64_t n, const std::function<void(int, int64_t)>& fn) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(0, i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&](int worker) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(worker, i);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& t : pool) t.join();
}

}  // namespace

absl::Status Int4QuantOptions::Validate() const {
  const int g = group_size;
  if (g < 32 || g > 1024 || (g & (g - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "int4 group size ", g, " not supported; valid: 32, 64, 128, 256, 512, 1024"));
  }
  if (refine_iterations < 0 || refine_iterations > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("int4 refine iterations ", refine_iterations, " outside [0, 1000]"));
  }
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("int4 quantization threads ", threads, " < 0"));
  }
  return absl::OkStatus();
}

// Quantizes one tile of rows at a time into the matrix's storage. One per worker thread.
class Int4Matrix::Builder {
 public:
  Builder(const Tensor& weight, const Int4QuantOptions& options, Int4Matrix& out)
      : weight_(weight), options_(options), m_(out) {
    const size_t cols = static_cast<size_t>(m_.cols_);
    const size_t groups = static_cast<size_t>(m_.n_groups_);
    rows_f32_.resize(static_cast<size_t>(kTileRows) * cols);
    codes_.resize(2 * static_cast<size_t>(m_.group_size_));
    rtn_.resize(kTileRows * groups);
    refined_.resize(kTileRows * groups);
    pointers_.reserve(kTileRows * groups);
    config_.iterations = options.refine_iterations;
  }

  void QuantizeTile(int64_t tile) {
    const int64_t cols = m_.cols_;
    const int64_t g_size = m_.group_size_;
    const int64_t n_groups = m_.n_groups_;
    const int64_t first_row = tile * kTileRows;
    const int64_t live_rows = std::min<int64_t>(kTileRows, m_.rows_ - first_row);
    uint8_t* data = m_.data_.get();

    for (int64_t r = 0; r < live_rows; ++r) {
      float* row = RowF32(r);
      RowToF32(weight_, first_row + r, row);
      for (int64_t g = 0; g < n_groups; ++g) {
        rtn_[Index(r, g)] = quant_internal::RtnParams(row + g * g_size, GroupLength(g));
      }
    }
    if (options_.refine) {
      std::copy(rtn_.begin(), rtn_.end(), refined_.begin());
      // Full groups of all rows in one call, then the shorter last groups.
      const int64_t full = cols / g_size;
      RefineGroupRange(live_rows, 0, full);
      if (full < n_groups) RefineGroupRange(live_rows, full, n_groups);
    }

    uint8_t* rtn_codes = codes_.data();
    uint8_t* refined_codes = codes_.data() + g_size;
    for (int64_t r = 0; r < live_rows; ++r) {
      const float* row = RowF32(r);
      for (int64_t g = 0; g < n_groups; ++g) {
        const float* w = row + g * g_size;
        const int n = GroupLength(g);
        const StoredParams rtn = quant_internal::StoreRtn(rtn_[Index(r, g)], inv_multiplier());
        const double rtn_error = quant_internal::AssignCodes(
            w, n, quant_internal::Load(rtn, m_.param_multiplier_), rtn_codes);
        StoredParams chosen = rtn;
        const uint8_t* codes = rtn_codes;
        double error = rtn_error;
        if (options_.refine) {
          const StoredParams refined =
              quant_internal::StoreNearest(refined_[Index(r, g)], inv_multiplier());
          const double refined_error = quant_internal::AssignCodes(
              w, n, quant_internal::Load(refined, m_.param_multiplier_), refined_codes);
          if (refined_error < rtn_error) {  // false for NaN: f16 overflow keeps RTN
            chosen = refined;
            codes = refined_codes;
            error = refined_error;
            ++stats_.refined_groups;
          }
        }
        // Groups never straddle panels.
        const Panel& pn = m_.panels_[static_cast<size_t>(g * g_size / Int4Matrix::kPanelCols)];
        uint8_t* chunk = data + pn.offset + tile * pn.chunk_bytes;
        uint16_t* params = reinterpret_cast<uint16_t*>(chunk);
        const int64_t local = g - pn.group0;
        params[r * pn.n_groups + local] = chosen.scale;
        params[(kTileRows + r) * pn.n_groups + local] = chosen.offset;
        Pack(r, g * g_size - pn.col0, codes, n,
             reinterpret_cast<uint16_t*>(chunk + pn.param_bytes));
        stats_.sq_error += error;
        stats_.rtn_sq_error += rtn_error;
        ++stats_.groups;
      }
    }
  }

  const Int4QuantStats& stats() const { return stats_; }

 private:
  float* RowF32(int64_t r) { return rows_f32_.data() + r * m_.cols_; }
  size_t Index(int64_t r, int64_t g) const { return static_cast<size_t>(r * m_.n_groups_ + g); }
  int GroupLength(int64_t g) const {
    return static_cast<int>(std::min(m_.group_size_, m_.cols_ - g * m_.group_size_));
  }
  float inv_multiplier() const { return 1.0f / m_.param_multiplier_; }

  // Refines groups [g_begin, g_end) of the tile's live rows; all have the same length.
  void RefineGroupRange(int64_t live_rows, int64_t g_begin, int64_t g_end) {
    pointers_.clear();
    std::vector<GroupParams> params;
    params.reserve(static_cast<size_t>(live_rows * (g_end - g_begin)));
    for (int64_t r = 0; r < live_rows; ++r) {
      for (int64_t g = g_begin; g < g_end; ++g) {
        pointers_.push_back(RowF32(r) + g * m_.group_size_);
        params.push_back(refined_[Index(r, g)]);
      }
    }
    quant_internal::RefineGroups(pointers_.data(), static_cast<int64_t>(pointers_.size()),
                                 GroupLength(g_begin), config_, params.data());
    size_t i = 0;
    for (int64_t r = 0; r < live_rows; ++r) {
      for (int64_t g = g_begin; g < g_end; ++g) refined_[Index(r, g)] = params[i++];
    }
  }

  // Writes codes of panel columns [c0, c0 + n) of tile row r into the chunk's nibbles (see the
  // layout in int4_matrix.h).
  void Pack(int64_t r, int64_t c0, const uint8_t* codes, int n, uint16_t* nibbles) const {
    for (int i = 0; i < n; ++i) {
      const int64_t c = c0 + i;
      const int64_t block = c / kBlockCols;
      const int64_t k = (c % kBlockCols) / kSliceCols;
      const int64_t j = c % kSliceCols;
      nibbles[(block * kTileRows + r) * kSliceCols + j] |=
          static_cast<uint16_t>(codes[i] << (4 * k));
    }
  }

  const Tensor& weight_;
  const Int4QuantOptions& options_;
  Int4Matrix& m_;
  quant_internal::RefineConfig config_;
  std::vector<float> rows_f32_;  // [kTileRows][cols]
  std::vector<uint8_t> codes_;   // RTN and refined codes of one group
  std::vector<GroupParams> rtn_, refined_;  // [kTileRows][n_groups]
  std::vector<const float*> pointers_;
  Int4QuantStats stats_;
};

namespace {

// The layout a Quantize call writes (Int4QuantOptions::layout).
absl::StatusOr<Int4Layout> ResolveLayout(const Int4QuantOptions& options, const Tensor& weight) {
  const bool fits = weight.defined() && weight.rank() == 2 &&
                    Int4Matrix::GroupLanesFit(weight.dim(1), options.group_size);
  switch (options.layout) {
    case Int4Layout::kAuto:
      return fits && Int4MatMulUsesInt8() ? Int4Layout::kGroupLanes : Int4Layout::kBlocks;
    case Int4Layout::kBlocks:
      return Int4Layout::kBlocks;
    case Int4Layout::kGroupLanes:
      if (!Int4VnniAvailable() && !Int4Avx2Available()) {
        return absl::FailedPreconditionError(
            "int4 layout kGroupLanes needs AVX512-VNNI or AVX2 (an int8 path of Int4MatMul)");
      }
      if (!fits) {
        return absl::InvalidArgumentError(absl::StrCat(
            "int4 layout kGroupLanes needs whole 16-group superblocks per panel; got ",
            weight.defined() ? weight.DebugString() : std::string("an empty tensor"), " at g",
            options.group_size));
      }
      return Int4Layout::kGroupLanes;
  }
  return Int4Layout::kBlocks;
}

}  // namespace

absl::StatusOr<Int4Matrix> Int4Matrix::Quantize(const Tensor& weight,
                                                const Int4QuantOptions& options,
                                                Int4QuantStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (!weight.defined() || weight.rank() != 2 || weight.dim(0) < 1 || weight.dim(1) < 1 ||
      !weight.device().is_cpu() ||
      (weight.dtype() != DType::kF32 && weight.dtype() != DType::kBF16 &&
       weight.dtype() != DType::kF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("int4 quantization needs a non-empty [rows][cols] f32/bf16/f16 host tensor, "
                     "got ",
                     weight.defined() ? weight.DebugString() : std::string("an undefined tensor")));
  }
  absl::StatusOr<Int4Layout> resolved = ResolveLayout(options, weight);
  if (!resolved.ok()) return resolved.status();
  const Int4Layout layout = *resolved;
  Int4Matrix m;
  m.rows_ = weight.dim(0);
  m.cols_ = weight.dim(1);
  m.group_size_ = options.group_size;
  m.n_groups_ = CeilDiv(m.cols_, m.group_size_);
  m.n_blocks_ = CeilDiv(m.cols_, kBlockCols);
  m.n_tiles_ = CeilDiv(m.rows_, kTileRows);
  for (int64_t col0 = 0; col0 < m.cols_; col0 += kPanelCols) {
    Panel p;
    p.col0 = col0;
    p.cols = std::min<int64_t>(kPanelCols, m.cols_ - col0);
    p.group0 = col0 / m.group_size_;
    p.n_groups = CeilDiv(p.cols, m.group_size_);
    p.n_blocks = CeilDiv(p.cols, kBlockCols);
    p.param_bytes = CeilDiv(kTileRows * p.n_groups * 4, 64) * 64;
    p.chunk_bytes = p.param_bytes + p.n_blocks * kTileRows * kBlockBytes;
    p.offset = m.bytes_;
    m.bytes_ += m.n_tiles_ * p.chunk_bytes;
    m.panels_.push_back(p);
  }

  int threads = options.threads > 0 ? options.threads
                                    : static_cast<int>(std::thread::hardware_concurrency());
  threads = static_cast<int>(std::clamp<int64_t>(threads, 1, m.n_tiles_));

  // Largest |w| (for the f16 multiplier) and a check that every weight is finite.
  std::vector<float> max_abs(static_cast<size_t>(threads), 0.0f);
  std::vector<uint8_t> finite(static_cast<size_t>(threads), 1);
  {
    std::vector<std::vector<float>> rows(static_cast<size_t>(threads));
    ParallelFor(threads, m.rows_, [&](int worker, int64_t r) {
      std::vector<float>& row = rows[static_cast<size_t>(worker)];
      row.resize(static_cast<size_t>(m.cols_));
      RowToF32(weight, r, row.data());
      float mx = max_abs[static_cast<size_t>(worker)];
      bool ok = true;
      for (float v : row) {
        ok &= std::isfinite(v);
        mx = std::max(mx, std::fabs(v));
      }
      max_abs[static_cast<size_t>(worker)] = mx;
      if (!ok) finite[static_cast<size_t>(worker)] = 0;
    });
  }
  if (std::find(finite.begin(), finite.end(), 0) != finite.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("int4 quantization: ", weight.DebugString(), " has a non-finite weight"));
  }
  const float largest = *std::max_element(max_abs.begin(), max_abs.end());
  if (largest > 0.0f) {
    // |offset| <= largest and scale <= 2 * largest / 15 land in [2^12, 2^13) and below; the
    // refined values may stray a little further, far from the f16 maximum of 65504.
    m.param_multiplier_ = std::ldexp(1.0f, std::max(std::ilogb(largest) - 12, -126));
  }

  // Streamed every step: huge pages (core/common/streamed_memory.h).
  const size_t bytes = static_cast<size_t>(m.bytes());
  void* raw = AllocateStreamedMemory(bytes);
  if (raw == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  m.data_.reset(static_cast<uint8_t*>(raw));

  std::vector<Builder> builders;
  builders.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) builders.emplace_back(weight, options, m);
  ParallelFor(threads, m.n_tiles_, [&](int worker, int64_t tile) {
    builders[static_cast<size_t>(worker)].QuantizeTile(tile);
  });
  // The Builder writes kBlocks; the VNNI kernel's order is a permutation of it, tile by tile.
  if (layout == Int4Layout::kGroupLanes) {
    ParallelFor(threads, m.n_tiles_, [&](int, int64_t tile) { m.PermuteTileToGroupLanes(tile); });
    m.layout_ = Int4Layout::kGroupLanes;
  }

  if (stats != nullptr) {
    *stats = Int4QuantStats();
    for (const Builder& b : builders) {
      stats->sq_error += b.stats().sq_error;
      stats->rtn_sq_error += b.stats().rtn_sq_error;
      stats->groups += b.stats().groups;
      stats->refined_groups += b.stats().refined_groups;
    }
    stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return m;
}

void Int4Matrix::Free::operator()(uint8_t* p) const { std::free(p); }

Int4Matrix& Int4Matrix::operator=(Int4Matrix&& other) noexcept {
  if (this != &other) {
    rows_ = std::exchange(other.rows_, 0);
    cols_ = std::exchange(other.cols_, 0);
    group_size_ = std::exchange(other.group_size_, 0);
    n_groups_ = std::exchange(other.n_groups_, 0);
    n_blocks_ = std::exchange(other.n_blocks_, 0);
    n_tiles_ = std::exchange(other.n_tiles_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    panels_ = std::exchange(other.panels_, {});
    param_multiplier_ = std::exchange(other.param_multiplier_, 1.0f);
    layout_ = std::exchange(other.layout_, Int4Layout::kBlocks);
    data_ = std::move(other.data_);
  }
  return *this;
}

bool Int4Matrix::GroupLanesFit(int64_t cols, int64_t group_size) {
  if (cols < 1 || group_size < 32 || kPanelCols % group_size != 0) return false;
  // Every panel but the last has kPanelCols columns (kPanelCols / G groups); the last the rest.
  const int64_t full_groups = kPanelCols / group_size;
  const int64_t last_cols = cols % kPanelCols;
  if (cols >= kPanelCols && full_groups % 16 != 0) return false;
  return last_cols == 0 || (last_cols % group_size == 0 && (last_cols / group_size) % 16 == 0);
}

namespace {

// Where one code lives in a chunk's nibbles (int4_matrix.h), for tile row rr and panel column
// cc; Code() reads through these and PermuteTileToGroupLanes moves codes between them.
// kBlocks: the code in u16 word `word`, bits [shift, shift + 4).
struct BlocksPlace {
  int64_t word;
  int shift;
};
BlocksPlace BlocksPlaceOf(int64_t rr, int64_t cc) {
  constexpr int64_t kBlockCols = Int4Matrix::kBlockCols, kSliceCols = Int4Matrix::kSliceCols;
  return {((cc / kBlockCols) * Int4Matrix::kTileRows + rr) * kSliceCols + cc % kSliceCols,
          static_cast<int>(4 * ((cc % kBlockCols) / kSliceCols))};
}
// kGroupLanes: the code of column `within` of panel group `group` (G = group_size) in byte
// `byte`, bits [shift, shift + 4).
struct LanesPlace {
  int64_t byte;
  int shift;
};
LanesPlace LanesPlaceOf(int64_t rr, int64_t group, int64_t within, int64_t group_size) {
  const int64_t block = (group / 16) * (group_size / 8) + within / 8;
  const int64_t j = within % 8;
  return {(block * Int4Matrix::kTileRows + rr) * Int4Matrix::kBlockBytes + 4 * (group % 16) +
              j % 4,
          j < 4 ? 0 : 4};
}

}  // namespace

void Int4Matrix::PermuteTileToGroupLanes(int64_t tile) {
  std::vector<uint8_t> blocks;
  for (int p = 0; p < n_panels(); ++p) {
    const Panel& pn = panel(p);
    uint8_t* nibbles = data_.get() + pn.offset + tile * pn.chunk_bytes + pn.param_bytes;
    const size_t n = static_cast<size_t>(pn.n_blocks * kTileRows * kBlockBytes);
    blocks.assign(nibbles, nibbles + n);  // the kBlocks order, read below
    std::memset(nibbles, 0, n);
    const auto* words = reinterpret_cast<const uint16_t*>(blocks.data());
    for (int64_t rr = 0; rr < kTileRows; ++rr) {
      for (int64_t group = 0; group < pn.n_groups; ++group) {
        for (int64_t within = 0; within < group_size_; ++within) {
          const BlocksPlace from = BlocksPlaceOf(rr, group * group_size_ + within);
          const LanesPlace to = LanesPlaceOf(rr, group, within, group_size_);
          const int code = (words[from.word] >> from.shift) & 0xF;
          nibbles[to.byte] |= static_cast<uint8_t>(code << to.shift);
        }
      }
    }
  }
}

int Int4Matrix::Code(int64_t r, int64_t c) const {
  const int p = static_cast<int>(c / kPanelCols);
  const int64_t cc = c - panel(p).col0;
  const int64_t rr = r % kTileRows;
  if (layout_ == Int4Layout::kGroupLanes) {
    const LanesPlace at = LanesPlaceOf(rr, cc / group_size_, cc % group_size_, group_size_);
    const auto* bytes = reinterpret_cast<const uint8_t*>(chunk_nibbles(p, r / kTileRows));
    return (bytes[at.byte] >> at.shift) & 0xF;
  }
  const BlocksPlace at = BlocksPlaceOf(rr, cc);
  return (chunk_nibbles(p, r / kTileRows)[at.word] >> at.shift) & 0xF;
}

float Int4Matrix::Scale(int64_t r, int64_t g) const {
  const int p = static_cast<int>(g * group_size_ / kPanelCols);
  const Panel& pn = panel(p);
  return F16ToF32(chunk_params(p, r / kTileRows)[(r % kTileRows) * pn.n_groups + g - pn.group0]) *
         param_multiplier_;
}

float Int4Matrix::Offset(int64_t r, int64_t g) const {
  const int p = static_cast<int>(g * group_size_ / kPanelCols);
  const Panel& pn = panel(p);
  return F16ToF32(chunk_params(
             p, r / kTileRows)[(kTileRows + r % kTileRows) * pn.n_groups + g - pn.group0]) *
         param_multiplier_;
}

float Int4Matrix::Dequantize(int64_t r, int64_t c) const {
  const int64_t g = c / group_size_;
  return static_cast<float>(Code(r, c)) * Scale(r, g) + Offset(r, g);
}

absl::StatusOr<Tensor> Int4Matrix::DequantizeToF32() const {
  if (empty()) return absl::FailedPreconditionError("DequantizeToF32 of an empty Int4Matrix");
  absl::StatusOr<Tensor> out = Tensor::Zeros(DType::kF32, {rows_, cols_});
  if (!out.ok()) return out.status();
  float* dst = out->mutable_data<float>();
  for (int64_t r = 0; r < rows_; ++r) {
    for (int64_t c = 0; c < cols_; ++c) dst[r * cols_ + c] = Dequantize(r, c);
  }
  return out;
}

}  // namespace estuary
