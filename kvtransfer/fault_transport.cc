#include "kvtransfer/fault_transport.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace estuary::kvtransfer {
namespace {

// Sleeps `delay`, or until `deadline` when that comes first (then DEADLINE_EXCEEDED).
absl::Status Delay(absl::Duration delay, absl::Time deadline, const char* what) {
  if (delay <= absl::ZeroDuration()) return absl::OkStatus();
  const absl::Time until = absl::Now() + delay;
  if (until > deadline) {
    absl::SleepFor(deadline - absl::Now());
    return absl::DeadlineExceededError(absl::StrCat("fault injection: ", what, " delayed by ",
                                                    absl::FormatDuration(delay),
                                                    " past its deadline"));
  }
  absl::SleepFor(delay);
  return absl::OkStatus();
}

}  // namespace

void CorruptBytes(std::string& payload) {
  if (payload.empty()) return;
  for (size_t i = 0; i < payload.size(); i += 7) payload[i] = static_cast<char>(payload[i] ^ 0x5a);
  payload.back() = static_cast<char>(payload.back() ^ 0xa5);
}

absl::StatusOr<std::unique_ptr<Endpoint>> FaultTransport::Connect(std::string_view peer_address,
                                                                  absl::Time deadline) {
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> ep, inner_->Connect(peer_address, deadline));
  return std::unique_ptr<Endpoint>(new FaultEndpoint(std::move(ep), config_));
}

absl::StatusOr<Message> FaultTransport::ReceiveFrom(const Endpoint& peer, absl::Time deadline) {
  if (const auto* fault = dynamic_cast<const FaultEndpoint*>(&peer); fault != nullptr) {
    // Waits in slices so that an injected endpoint failure ends the wait too.
    while (true) {
      ESTUARY_RETURN_IF_ERROR(fault->Health());
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(50));
      absl::StatusOr<Message> m = inner_->ReceiveFrom(fault->inner(), slice);
      if (!absl::IsDeadlineExceeded(m.status()) || slice >= deadline) return m;
    }
  }
  return inner_->ReceiveFrom(peer, deadline);
}

absl::Status FaultEndpoint::CountOp() {
  const int64_t n = ops_.fetch_add(1);
  if (config_.fail_after_ops >= 0 && n >= config_.fail_after_ops) {
    failed_.store(true);
    return absl::UnavailableError(
        absl::StrCat("fault injection: endpoint failed after ", config_.fail_after_ops,
                     " operations"));
  }
  return absl::OkStatus();
}

absl::Status FaultEndpoint::Put(const void* local, size_t bytes, const RemoteRegion& dst,
                                uint64_t dst_offset, absl::Time deadline) {
  ESTUARY_RETURN_IF_ERROR(CountOp());
  if (config_.stall_puts) {
    absl::SleepFor(config_.put_delay);
    return inner_->Put(local, bytes, dst, dst_offset, absl::InfiniteFuture());
  }
  ESTUARY_RETURN_IF_ERROR(Delay(config_.put_delay, deadline, "put"));
  return inner_->Put(local, bytes, dst, dst_offset, deadline);
}

absl::Status FaultEndpoint::Flush(absl::Time deadline) {
  ESTUARY_RETURN_IF_ERROR(CountOp());
  return inner_->Flush(deadline);
}

absl::Status FaultEndpoint::SendMessage(std::string_view payload, absl::Time deadline) {
  ESTUARY_RETURN_IF_ERROR(CountOp());
  if (config_.message_filter && !config_.message_filter(payload)) {
    return inner_->SendMessage(payload, deadline);
  }
  const int64_t index = messages_.fetch_add(1);
  ESTUARY_RETURN_IF_ERROR(Delay(config_.message_delay, deadline, "message"));
  if (config_.drop_all_messages || index == config_.drop_message_index) {
    return absl::OkStatus();  // silently lost
  }
  if (index == config_.corrupt_message_index) {
    std::string corrupted(payload);
    CorruptBytes(corrupted);
    return inner_->SendMessage(corrupted, deadline);
  }
  return inner_->SendMessage(payload, deadline);
}

absl::Status FaultEndpoint::Health() const {
  if (failed_.load()) return absl::UnavailableError("fault injection: endpoint failed");
  return inner_->Health();
}

}  // namespace estuary::kvtransfer
