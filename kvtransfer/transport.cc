#include "kvtransfer/transport.h"

#include <algorithm>
#include <utility>

#include "core/common/logging.h"

namespace estuary::kvtransfer {

uint64_t Transport::PeerId(std::string_view address) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : address) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void MessageInbox::Push(Message message) {
  absl::MutexLock lock(&mu_);
  if (size_ >= capacity_) {
    ESTUARY_LOG(WARNING) << "kvtransfer inbox full (" << capacity_ << " messages): dropping a "
                         << message.payload.size() << "-byte message";
    return;
  }
  queues_[message.sender_id].emplace_back(next_seq_++, std::move(message));
  ++size_;
}

absl::StatusOr<Message> MessageInbox::Pop(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return size_ > 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError("no kvtransfer message before the deadline");
  }
  auto oldest = queues_.end();
  for (auto it = queues_.begin(); it != queues_.end(); ++it) {
    if (it->second.empty()) continue;
    if (oldest == queues_.end() || it->second.front().first < oldest->second.front().first) {
      oldest = it;
    }
  }
  Message m = std::move(oldest->second.front().second);
  oldest->second.pop_front();
  if (oldest->second.empty()) queues_.erase(oldest);
  --size_;
  return m;
}

absl::StatusOr<Message> MessageInbox::PopFrom(uint64_t sender_id, absl::Time deadline,
                                              const std::function<absl::Status()>& health) {
  while (true) {
    // Health is checked without the inbox lock: it may take transport locks.
    if (absl::Status h = health(); !h.ok()) return h;
    absl::MutexLock lock(&mu_);
    const uint64_t generation = wake_generation_;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = queues_.find(sender_id);
      return (it != queues_.end() && !it->second.empty()) || wake_generation_ != generation;
    };
    const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(50));
    mu_.AwaitWithDeadline(absl::Condition(&ready), slice);
    auto it = queues_.find(sender_id);
    if (it != queues_.end() && !it->second.empty()) {
      Message m = std::move(it->second.front().second);
      it->second.pop_front();
      if (it->second.empty()) queues_.erase(it);
      --size_;
      return m;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("no kvtransfer message from the peer before the deadline");
    }
  }
}

void MessageInbox::Wake() {
  absl::MutexLock lock(&mu_);
  ++wake_generation_;
}

}  // namespace estuary::kvtransfer
