#include "router/active_calls.h"

#include <utility>

namespace estuary::router {

bool ActiveCalls::Add(const std::string& id, std::shared_ptr<GenerateCall> call) {
  absl::MutexLock lock(&mu_);
  return calls_.try_emplace(id, std::move(call)).second;
}

void ActiveCalls::Remove(const std::string& id) {
  absl::MutexLock lock(&mu_);
  calls_.erase(id);
}

std::shared_ptr<GenerateCall> ActiveCalls::Find(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  return it == calls_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<GenerateCall>> ActiveCalls::All() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<GenerateCall>> all;
  all.reserve(calls_.size());
  for (auto& [id, call] : calls_) all.push_back(call);
  return all;
}

int ActiveCalls::size() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(calls_.size());
}

}  // namespace estuary::router
