#include "kvtransfer/endpoint_cache.h"

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace estuary::kvtransfer {

absl::StatusOr<const RemoteRegion*> CachedEndpoint::Import(const RegionDescriptor& region) {
  std::string key = absl::StrCat(region.base, ":", region.bytes, ":");
  key.append(region.rkey);
  absl::MutexLock lock(&mu_);
  if (auto it = imported_.find(key); it != imported_.end()) return it->second;
  ESTUARY_ASSIGN_OR_RETURN(const RemoteRegion* remote, endpoint_->ImportRegion(region));
  imported_.emplace(std::move(key), remote);
  return remote;
}

absl::Status CachedEndpoint::Put(const void* local, size_t bytes, const RemoteRegion& dst,
                                 uint64_t dst_offset, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return endpoint_->Put(local, bytes, dst, dst_offset, deadline);
}

absl::Status CachedEndpoint::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return endpoint_->Flush(deadline);
}

absl::Status CachedEndpoint::SendMessage(std::string_view payload, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return endpoint_->SendMessage(payload, deadline);
}

absl::Status CachedEndpoint::Health() const {
  absl::MutexLock lock(&mu_);
  return endpoint_->Health();
}

absl::StatusOr<std::shared_ptr<CachedEndpoint>> EndpointCache::Get(std::string_view peer_address,
                                                                   int src_rank,
                                                                   absl::Time deadline) {
  std::shared_ptr<Slot> slot;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Slot>& s = slots_[std::make_pair(std::string(peer_address), src_rank)];
    if (s == nullptr) s = std::make_shared<Slot>();
    slot = s;
  }
  absl::MutexLock lock(&slot->mu);
  if (slot->current != nullptr && slot->current->Health().ok()) return slot->current;
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> endpoint,
                           transport_.Connect(peer_address, deadline));
  {
    absl::MutexLock counter_lock(&mu_);
    ++connects_;
  }
  slot->current = std::make_shared<CachedEndpoint>(std::move(endpoint));
  return slot->current;
}

int64_t EndpointCache::connects() const {
  absl::MutexLock lock(&mu_);
  return connects_;
}

}  // namespace estuary::kvtransfer
