#include "router/prompt_homes.h"

#include <algorithm>

namespace estuary::router {

PromptHomes::PromptHomes(size_t capacity, absl::Duration ttl)
    : capacity_(std::max<size_t>(capacity, 1)), ttl_(ttl) {}

void PromptHomes::ExpireLocked(absl::Time now) {
  while (!order_.empty() && (order_.size() > capacity_ || now - order_.front().first > ttl_)) {
    auto it = homes_.find(order_.front().second);
    // A later Record of the same id left a newer entry in order_: keep the home for that one.
    if (it != homes_.end() && it->second.recorded == order_.front().first) homes_.erase(it);
    order_.pop_front();
  }
}

void PromptHomes::Record(const std::string& request_id, const std::string& decode_worker_id,
                         absl::Span<const int32_t> prompt, absl::Time now) {
  absl::MutexLock lock(&mu_);
  homes_[request_id] = Home{decode_worker_id, std::vector<int32_t>(prompt.begin(), prompt.end()),
                            now};
  order_.emplace_back(now, request_id);
  ExpireLocked(now);
}

std::optional<std::string> PromptHomes::Find(const std::string& request_id,
                                             absl::Span<const int32_t> prompt, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = homes_.find(request_id);
  if (it == homes_.end()) return std::nullopt;
  if (!std::equal(prompt.begin(), prompt.end(), it->second.prompt.begin(),
                  it->second.prompt.end())) {
    return std::nullopt;
  }
  return it->second.decode_worker_id;
}

}  // namespace estuary::router
