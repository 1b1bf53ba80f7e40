#include "decode/token_streams.h"

#include "absl/strings/str_cat.h"

namespace estuary {

absl::Status TokenStreams::Open(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (queues_.size() >= max_open_) DropUnclaimed(absl::Now());
  if (queues_.size() >= max_open_ && !queues_.contains(request_id)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this worker has ", queues_.size(), " requests in flight (--max-num-seqs + "
        "--max-waiting-requests); try another worker or again later"));
  }
  if (!queues_.try_emplace(request_id).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("a token stream for request '", request_id, "' is already open"));
  }
  return absl::OkStatus();
}

void TokenStreams::Push(const TokenEvent& event) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(event.request_id);
  if (it != queues_.end()) {
    it->second.events.push_back(event);
    if (event.finished) it->second.finished_at = now;
  }
  if (event.finished) DropUnclaimed(now);
}

void TokenStreams::DropUnclaimed(absl::Time now) {
  absl::erase_if(queues_, [&](const auto& entry) {
    return entry.second.finished_at != absl::InfiniteFuture() &&
           now - entry.second.finished_at > unclaimed_ttl_;
  });
}

size_t TokenStreams::open_streams() const {
  absl::MutexLock lock(&mu_);
  return queues_.size();
}

absl::StatusOr<std::vector<TokenEvent>> TokenStreams::Next(const std::string& request_id,
                                                           absl::Time deadline) {
  struct Wait {
    const TokenStreams* self;
    const std::string* id;
    bool Ready() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      auto it = self->queues_.find(*id);
      return it == self->queues_.end() || !it->second.events.empty();
    }
  };
  const Wait wait{this, &request_id};
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&wait, &Wait::Ready), deadline);
  auto it = queues_.find(request_id);
  if (it == queues_.end()) {
    return absl::NotFoundError(absl::StrCat("no token stream for request '", request_id, "'"));
  }
  std::vector<TokenEvent> events(it->second.events.begin(), it->second.events.end());
  it->second.events.clear();
  return events;
}

void TokenStreams::Close(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  queues_.erase(request_id);
}

bool TokenStreams::IsOpen(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  return queues_.contains(request_id);
}

}  // namespace estuary
