#pragma once
// RequestInbox: how requests and aborts reach an engine thread from other threads (the decode
// and prefill engines' Submit / Abort). It also keeps the set of live request ids, so a
// duplicate id is refused at once and an abort of an unknown id says so. The engine takes the
// queued requests and aborts at the start of each step and forgets an id when its request ends.
// Thread-safe.

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace estuary {

template <typename Request>
class RequestInbox {
 public:
  // Queues `request` under `id`. INVALID_ARGUMENT when `id` is live already.
  absl::Status Push(const std::string& id, Request request) {
    absl::MutexLock lock(&mu_);
    if (!live_.insert(id).second) return Duplicate(id);
    requests_.push_back(std::move(request));
    return absl::OkStatus();
  }
  // Makes `id` live without queueing anything (a request the engine receives another way).
  absl::Status Claim(const std::string& id) {
    absl::MutexLock lock(&mu_);
    if (!live_.insert(id).second) return Duplicate(id);
    return absl::OkStatus();
  }
  // Queues an abort of a live request; false when `id` is not live.
  bool Abort(const std::string& id) {
    absl::MutexLock lock(&mu_);
    if (!live_.contains(id)) return false;
    aborts_.push_back(id);
    return true;
  }
  // The requests and aborts queued since the last call.
  void Take(std::vector<Request>* requests, std::vector<std::string>* aborts) {
    absl::MutexLock lock(&mu_);
    requests->swap(requests_);
    aborts->swap(aborts_);
    requests_.clear();
    aborts_.clear();
  }
  // `id` ended: it may be used again.
  void Forget(const std::string& id) {
    absl::MutexLock lock(&mu_);
    live_.erase(id);
  }
  // Requests queued and not yet taken.
  size_t Queued() const {
    absl::MutexLock lock(&mu_);
    return requests_.size();
  }
  // Nothing queued.
  bool Empty() const {
    absl::MutexLock lock(&mu_);
    return requests_.empty() && aborts_.empty();
  }

 private:
  static absl::Status Duplicate(const std::string& id) {
    return absl::InvalidArgumentError(absl::StrCat("request id '", id, "' is already live"));
  }

  mutable absl::Mutex mu_;
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> aborts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary
