#include "core/kvcache/sequence_kv.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/kvcache/prefix_hash.h"

namespace estuary {

SequenceKv::SequenceKv(KvPool* pool) : pool_(pool) {
  if (pool_ != nullptr) {
    block_size_ = pool_->layout().block_size;
    head_dim_ = pool_->layout().head_dim;
  }
}

SequenceKv::~SequenceKv() { Release(); }

SequenceKv::SequenceKv(SequenceKv&& other) noexcept
    : pool_(other.pool_),
      block_size_(other.block_size_),
      head_dim_(other.head_dim_),
      pages_(std::move(other.pages_)),
      page_hashes_(std::move(other.page_hashes_)),
      length_(other.length_),
      cached_tokens_(other.cached_tokens_) {
  other.pages_.clear();
  other.page_hashes_.clear();
  other.length_ = 0;
  other.cached_tokens_ = 0;
}

SequenceKv& SequenceKv::operator=(SequenceKv&& other) noexcept {
  if (this == &other) return *this;
  Release();
  pool_ = other.pool_;
  block_size_ = other.block_size_;
  head_dim_ = other.head_dim_;
  pages_ = std::move(other.pages_);
  page_hashes_ = std::move(other.page_hashes_);
  length_ = other.length_;
  cached_tokens_ = other.cached_tokens_;
  other.pages_.clear();
  other.page_hashes_.clear();
  other.length_ = 0;
  other.cached_tokens_ = 0;
  return *this;
}

absl::Status SequenceKv::Reserve(int num_tokens) {
  if (pool_ == nullptr) return absl::FailedPreconditionError("SequenceKv: no pool");
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SequenceKv: Reserve(", num_tokens, ")"));
  }
  const int64_t needed = (int64_t{num_tokens} + block_size_ - 1) / block_size_;
  const int64_t have = static_cast<int64_t>(pages_.size());
  if (needed <= have) return absl::OkStatus();
  try {
    pages_.reserve(static_cast<size_t>(needed));  // so that appending below cannot throw
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("SequenceKv: Reserve(", num_tokens, ")"));
  }
  ESTUARY_ASSIGN_OR_RETURN(std::vector<int32_t> fresh,
                           pool_->Allocate(static_cast<int>(needed - have)));
  pages_.insert(pages_.end(), fresh.begin(), fresh.end());
  return absl::OkStatus();
}

absl::Status SequenceKv::AdoptPrefix(absl::Span<const int32_t> prompt) {
  if (pool_ == nullptr) return absl::FailedPreconditionError("SequenceKv: no pool");
  if (!pages_.empty() || length_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("SequenceKv: AdoptPrefix on a sequence holding ", pages_.size(), " pages"));
  }
  // Blocks entirely before the prompt's last token.
  const size_t max_blocks =
      prompt.empty() ? 0 : (prompt.size() - 1) / static_cast<size_t>(block_size_);
  if (max_blocks == 0) {
    pool_->RecordPrefixQuery(static_cast<int64_t>(prompt.size()), 0);
    return absl::OkStatus();
  }
  try {
    pages_.reserve(max_blocks);
    page_hashes_.reserve(max_blocks);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("SequenceKv: AdoptPrefix");
  }
  uint64_t parent = kPrefixHashSeed;
  for (size_t b = 0; b < max_blocks; ++b) {
    const uint64_t hash = HashPageTokens(
        parent,
        prompt.subspan(b * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_)));
    const std::optional<int32_t> page = pool_->LookupPrefix(hash);
    if (!page.has_value()) break;
    pages_.push_back(*page);
    page_hashes_.push_back(hash);
    parent = hash;
  }
  cached_tokens_ = static_cast<int>(pages_.size()) * block_size_;
  length_ = cached_tokens_;
  pool_->RecordPrefixQuery(static_cast<int64_t>(prompt.size()), cached_tokens_);
  return absl::OkStatus();
}

void SequenceKv::RegisterFullPages(absl::Span<const int32_t> tokens) {
  if (pool_ == nullptr) return;
  const size_t written = std::min(tokens.size(), static_cast<size_t>(length_));
  const size_t full_pages = std::min(written / static_cast<size_t>(block_size_), pages_.size());
  if (page_hashes_.size() >= full_pages) return;
  try {
    page_hashes_.reserve(full_pages);
  } catch (const std::bad_alloc&) {
    return;  // registration is an optimization; skipping it is always correct
  }
  uint64_t parent = page_hashes_.empty() ? kPrefixHashSeed : page_hashes_.back();
  for (size_t b = page_hashes_.size(); b < full_pages; ++b) {
    const uint64_t hash = HashPageTokens(
        parent,
        tokens.subspan(b * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_)));
    pool_->RegisterPrefix(hash, pages_[b]);
    page_hashes_.push_back(hash);
    parent = hash;
  }
}

void SequenceKv::Release() {
  if (pool_ != nullptr) {
    for (const int32_t page : pages_) pool_->Release(page);
  }
  pages_.clear();
  page_hashes_.clear();
  length_ = 0;
  cached_tokens_ = 0;
}

void SequenceKv::ReleaseBeyond(int num_tokens) {
  const int64_t keep_tokens = std::max({num_tokens, length_, frozen_tokens()});
  const size_t keep = static_cast<size_t>((keep_tokens + block_size_ - 1) / block_size_);
  while (pages_.size() > keep) {
    pool_->Release(pages_.back());
    pages_.pop_back();
  }
}

void SequenceKv::set_length(int n) {
  if (n < frozen_tokens() || n > capacity()) {
    {
      ESTUARY_LOG(ERROR) << "SequenceKv: set_length(" << n << ") outside [" << frozen_tokens()
                         << ", " << capacity() << "]";
    }
    std::abort();
  }
  length_ = n;
}

void SequenceKv::WriteKv(int layer, int pos, const float* k, const float* v, int shard) {
  const int n_kv_heads = pool_->layout().n_kv_heads;
  const size_t bytes = static_cast<size_t>(head_dim_) * sizeof(float);
  for (int h = 0; h < n_kv_heads; ++h) {
    std::memcpy(k_slot(layer, pos, h, shard), k + static_cast<int64_t>(h) * head_dim_, bytes);
    std::memcpy(v_slot(layer, pos, h, shard), v + static_cast<int64_t>(h) * head_dim_, bytes);
  }
}

}  // namespace estuary
