#pragma once
// FaultTransport: a decorator over any Transport that injects failures into the endpoints it
// creates, so that tests exercise the real error paths without a misbehaving network.
//
// Faults apply on the sending side (FaultEndpoint), in this order for each operation:
//   1. fail_after_ops: once `fail_after_ops` operations (Put, Flush, SendMessage) have been made on
//      the endpoint, every later one returns UNAVAILABLE and does nothing (a peer that died).
//   2. delays: the operation sleeps first (never past its deadline: when the delay would cross the
//      deadline it sleeps until the deadline and returns DEADLINE_EXCEEDED) - except a put with
//      `stall_puts`, which sleeps its whole delay and then posts anyway, as a writer stopped
//      between its last deadline check and the post would (the late put fencing must survive).
//   3. messages: a dropped message is reported sent (OK) but never delivered; a corrupted one is
//      delivered with some bytes flipped.
// Message faults (drop, corrupt, delay) apply only to messages `message_filter` selects (all
// when it is empty), and message indices count only those.
// Receiving (PollMessage, ReceiveFrom), registration and Connect pass straight through.
//
// Ownership: FaultTransport owns the wrapped transport; each FaultEndpoint owns its inner endpoint.
// Thread-safety: as the wrapped transport; counters are atomic.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

struct FaultConfig {
  bool drop_all_messages = false;
  int64_t drop_message_index = -1;     // drop the nth message (0-based) of each endpoint; -1: none
  int64_t corrupt_message_index = -1;  // flip bytes of the nth message of each endpoint; -1: none
  absl::Duration message_delay = absl::ZeroDuration();
  absl::Duration put_delay = absl::ZeroDuration();
  bool stall_puts = false;      // put_delay ignores the put's deadline (see above)
  int64_t fail_after_ops = -1;  // UNAVAILABLE from operation number fail_after_ops on; -1: never
  // Which messages the message faults apply to; empty: all.
  std::function<bool(std::string_view payload)> message_filter;
};

// Flips bytes of `payload` in place (every 7th byte and the first and last): what corruption does.
void CorruptBytes(std::string& payload);

class FaultTransport : public Transport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, const FaultConfig& config)
      : inner_(std::move(inner)), config_(config) {}

  Transport& inner() { return *inner_; }
  const FaultConfig& config() const { return config_; }

  std::string_view kind() const override { return inner_->kind(); }
  const std::string& Address() const override { return inner_->Address(); }
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> RegisterRegion(void* data,
                                                                   size_t bytes) override {
    return inner_->RegisterRegion(data, bytes);
  }
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> AllocateRegion(size_t bytes) override {
    return inner_->AllocateRegion(bytes);
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(std::string_view peer_address,
                                                    absl::Time deadline) override;
  absl::StatusOr<Message> PollMessage(absl::Time deadline) override {
    return inner_->PollMessage(deadline);
  }
  // `peer` may be a FaultEndpoint from this transport or an endpoint of the inner transport.
  absl::StatusOr<Message> ReceiveFrom(const Endpoint& peer, absl::Time deadline) override;

 private:
  std::unique_ptr<Transport> inner_;
  const FaultConfig config_;
};

class FaultEndpoint : public Endpoint {
 public:
  FaultEndpoint(std::unique_ptr<Endpoint> inner, const FaultConfig& config)
      : inner_(std::move(inner)), config_(config) {}

  const Endpoint& inner() const { return *inner_; }
  int64_t operations() const { return ops_.load(); }
  int64_t messages() const { return messages_.load(); }  // those message_filter selected

  uint64_t peer_id() const override { return inner_->peer_id(); }
  absl::StatusOr<const RemoteRegion*> ImportRegion(const RegionDescriptor& region) override {
    return inner_->ImportRegion(region);
  }
  absl::Status Put(const void* local, size_t bytes, const RemoteRegion& dst, uint64_t dst_offset,
                   absl::Time deadline) override;
  absl::Status Flush(absl::Time deadline) override;
  absl::Status SendMessage(std::string_view payload, absl::Time deadline) override;
  absl::Status Health() const override;

 private:
  // Counts the operation; UNAVAILABLE once past fail_after_ops.
  absl::Status CountOp();
  std::unique_ptr<Endpoint> inner_;
  const FaultConfig config_;
  std::atomic<int64_t> ops_{0};
  std::atomic<int64_t> messages_{0};
  std::atomic<bool> failed_{false};
};

}  // namespace estuary::kvtransfer
