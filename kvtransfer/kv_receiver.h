#pragma once
// KvReceiver: the decode worker's end of the KV push protocol (design §7; README "Push protocol").
//
// It registers every (layer, shard) region of the decode worker's KvPool with a Transport once,
// describes them (plus a request's reserved page ids and lease) in a TransferDescriptor for the
// prefill worker, and runs a thread that takes KvCompletion messages out of the transport's inbox
// and hands them to a callback (the decode engine's CompleteReservation / Abort).
//
// Completion messages (what KvPusher sends) go through DecodeKvCompletion (kv_completion.h). A
// message that does not decode (wrong magic, bad checksum, unparsable proto, nonsense fields) is
// logged and dropped; the reservation it might have been for then runs into its lease on the
// decode side.
//
// Ownership: the receiver keeps the RegisteredRegion handles (RAII) and references to the
// Transport and the KvPool, which must both outlive it.
//
// Threading: Create and Describe may be called from any thread (Describe is const and reads only
// immutable state). Start() starts one thread that polls Transport::PollMessage with a short
// deadline (kPollSlice) and calls `on_completion` on that thread, one completion at a time; the
// callback must be thread-safe with respect to the caller's other threads and must not call Stop()
// or destroy the receiver. Stop() (and the destructor) set a flag and join that thread, so they
// return within about kPollSlice plus the running callback. The receiver is the only consumer of
// the transport's PollMessage: any other message (not a completion) is dropped with a log line.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/kvcache/kv_pool.h"
#include "estuary/v1/kv_transfer.pb.h"
#include "kvtransfer/kv_completion.h"  // the codec, for users of the receiver
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

class KvReceiver {
 public:
  // How long one PollMessage waits: bounds how long Stop() takes.
  static constexpr absl::Duration kPollSlice = absl::Milliseconds(20);

  // Registers pool.layer_region(layer, shard) for every layer and shard. `fingerprint` is the
  // whole model's KV format (fingerprint.h); INVALID_ARGUMENT when it does not describe `pool`
  // (layers, head_dim, block size, and kv_heads == pool heads * num_shards); the transport's error
  // when a registration fails.
  static absl::StatusOr<std::unique_ptr<KvReceiver>> Create(
      Transport& transport, KvPool& pool, estuary::v1::KvFormatFingerprint fingerprint);
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  // The descriptor a prefill worker needs to push `request_id`'s prompt into `pages` (the
  // reservation's page ids in position order; the same ids on every shard), held until
  // `lease_deadline`.
  estuary::v1::TransferDescriptor Describe(const std::string& request_id,
                                           absl::Span<const int32_t> pages,
                                           absl::Time lease_deadline) const;

  // Starts the polling thread. FAILED_PRECONDITION when already started (or stopped: a receiver
  // runs once).
  absl::Status Start(std::function<void(const estuary::v1::KvCompletion&)> on_completion);
  // Stops and joins the polling thread; idempotent.
  void Stop();

  const estuary::v1::KvFormatFingerprint& fingerprint() const { return fingerprint_; }
  // Completions handed to the callback / messages dropped as malformed so far.
  int64_t completions() const { return completions_.load(); }
  int64_t dropped_messages() const { return dropped_.load(); }

 private:
  KvReceiver(Transport& transport, KvPool& pool, estuary::v1::KvFormatFingerprint fingerprint);
  void Loop(std::function<void(const estuary::v1::KvCompletion&)> on_completion);

  Transport& transport_;
  KvPool& pool_;
  const estuary::v1::KvFormatFingerprint fingerprint_;
  // [shard][layer]
  std::vector<std::vector<std::unique_ptr<RegisteredRegion>>> regions_;
  std::atomic<bool> stop_{false};
  absl::Mutex thread_mu_;  // serializes Start / Stop
  bool started_ ABSL_GUARDED_BY(thread_mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
  std::atomic<int64_t> completions_{0};
  std::atomic<int64_t> dropped_{0};
};

}  // namespace estuary::kvtransfer
