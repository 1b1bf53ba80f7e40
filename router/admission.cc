#include "router/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace estuary::router {

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    queued_ = std::exchange(other.queued_, false);
  }
  return *this;
}

bool Admission::Ticket::LeaveQueue() {
  if (owner_ == nullptr || !queued_) return false;
  queued_ = false;
  owner_->queued_.fetch_sub(1);
  return true;
}

void Admission::Ticket::Release() {
  if (owner_ == nullptr) return;
  LeaveQueue();
  owner_->streams_.fetch_sub(1);
  owner_ = nullptr;
}

absl::StatusOr<Admission::Ticket> Admission::Admit() {
  if (streams_.fetch_add(1) >= max_streams_) {
    streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the router serves ", max_streams_,
        " streams at once (--max-concurrent-streams); try again later"));
  }
  if (queued_.fetch_add(1) >= max_queued_) {
    queued_.fetch_sub(1);
    streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the router has ", max_queued_,
        " requests waiting for their first token (--max-queued-requests); try again later"));
  }
  return Ticket(this);
}

}  // namespace estuary::router
