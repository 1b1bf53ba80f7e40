#include "kvtransfer/attach_replies.h"

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "kvtransfer/kv_control_codec.h"

namespace estuary::kvtransfer {

AttachReplies::AttachReplies(Transport& transport)
    : transport_(transport), thread_([this] { Loop(); }) {}

AttachReplies::~AttachReplies() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void AttachReplies::Expect(const std::string& request_id, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  replies_[std::make_pair(request_id, epoch)] = std::nullopt;
}

void AttachReplies::Forget(const std::string& request_id, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  replies_.erase(std::make_pair(request_id, epoch));
}

absl::Status AttachReplies::Await(const std::string& request_id, uint64_t epoch,
                                  absl::Time deadline) {
  const auto key = std::make_pair(request_id, epoch);
  absl::MutexLock lock(&mu_);
  auto arrived = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = replies_.find(key);
    return it == replies_.end() || it->second.has_value();
  };
  mu_.AwaitWithDeadline(absl::Condition(&arrived), deadline);
  auto it = replies_.find(key);
  if (it == replies_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no attach of request '", request_id, "' is expected"));
  }
  if (!it->second.has_value()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the decode worker did not answer the attach of request '", request_id, "' in time"));
  }
  absl::Status out = *it->second;
  replies_.erase(it);
  return out;
}

void AttachReplies::Loop() {
  while (!stop_.load()) {
    absl::StatusOr<Message> m = transport_.PollMessage(absl::Now() + kPollSlice);
    if (!m.ok()) {
      if (!absl::IsDeadlineExceeded(m.status())) {
        ESTUARY_LOG(WARNING) << "KV attach replies: polling failed: " << m.status();
        absl::SleepFor(kPollSlice);  // do not spin on a persistent error
      }
      continue;
    }
    absl::StatusOr<estuary::v1::KvAttachReply> reply = DecodeKvAttachReply(m->payload);
    if (!reply.ok()) {
      dropped_.fetch_add(1);
      ESTUARY_LOG(WARNING) << "KV attach replies: dropped a message from peer " << m->sender_id
                           << ": " << reply.status();
      continue;
    }
    absl::Status verdict =
        reply->status_code() == 0
            ? absl::OkStatus()
            : absl::Status(static_cast<absl::StatusCode>(reply->status_code()),
                           absl::StrCat("the decode worker refused the writer: ",
                                        reply->status_message()));
    absl::MutexLock lock(&mu_);
    auto it = replies_.find(std::make_pair(reply->request_id(), reply->reservation_epoch()));
    if (it == replies_.end() || it->second.has_value()) {
      dropped_.fetch_add(1);
      ESTUARY_VLOG(1) << "KV attach replies: an unexpected reply for " << reply->request_id();
      continue;
    }
    it->second = std::move(verdict);
  }
}

}  // namespace estuary::kvtransfer
