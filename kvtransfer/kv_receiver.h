#pragma once
// KvReceiver: the decode worker's end of the KV push protocol (design §7; README "Push protocol").
//
// It registers every (layer, shard) region of the decode worker's KvPool with a Transport once,
// describes them (plus a request's reserved page ids, lease and epoch) in a TransferDescriptor
// for the prefill worker, sealed with the cluster's key (descriptor_seal.h), and runs a thread
// that takes the writers' control messages out of the transport's inbox (kv_control_codec.h): a
// KvAttach is checked against what this worker issued (its descriptor digest must be that of the
// descriptor Describe makes from the reservation the `issued` callback returns: the same pages,
// lease, epoch, regions and addresses), then goes to one callback (the decode engine's
// AttachWriter), and the verdict is sent back to the writer's transport as a KvAttachReply; a
// KvCompletion goes to the other (CompleteReservation / EndReservation). Both callbacks get the
// sender's transport id (Message::sender_id), which identifies the writer.
//
// A message that does not decode (wrong magic, bad checksum, unparsable proto, fields out of
// bounds) is logged and dropped; so is an attach whose writer address is not the sender's. The
// reservation it might have been for then runs into its lease on the decode side.
//
// Ownership: the receiver keeps the RegisteredRegion handles (RAII) and references to the
// Transport and the KvPool, which must both outlive it.
//
// Threading: Create and Describe may be called from any thread (Describe is const and reads only
// immutable state). Start() starts one thread that polls Transport::PollMessage with a short
// deadline (kPollSlice) and calls `on_completion` on that thread, one completion at a time; the
// callback must be thread-safe with respect to the caller's other threads and must not call Stop()
// or destroy the receiver. Stop() (and the destructor) set a flag and join that thread, so they
// return within about kPollSlice plus the running callback (and a reply's send, bounded by
// kReplyTimeout). The receiver is the only consumer of the transport's PollMessage: any other
// message is dropped with a log line.

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
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/endpoint_cache.h"
#include "kvtransfer/kv_control_codec.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

// A reservation as its worker issued it: what Describe made its descriptor from.
struct IssuedReservation {
  std::vector<int32_t> pages;
  absl::Time lease_deadline;
};

// What the receiver hands on, on its thread. `writer` is the sender's transport id.
struct KvReceiverCallbacks {
  // The live reservation (request id, epoch), or why there is none (the attach is refused with
  // that status). Without this callback every attach is refused.
  std::function<absl::StatusOr<IssuedReservation>(const std::string& request_id, uint64_t epoch)>
      issued;
  // The verdict is sent back to the writer (OK: it may push).
  std::function<absl::Status(const estuary::v1::KvAttach& attach, uint64_t writer)> on_attach;
  std::function<void(const estuary::v1::KvCompletion& completion, uint64_t writer)> on_completion;
};

class KvReceiver {
 public:
  // How long one PollMessage waits: bounds how long Stop() takes.
  static constexpr absl::Duration kPollSlice = absl::Milliseconds(20);
  // Bounds connecting back to a writer and sending it the attach reply.
  static constexpr absl::Duration kReplyTimeout = absl::Seconds(1);

  // Registers pool.layer_region(layer, shard) for every layer and shard. `fingerprint` is the
  // whole model's KV format (fingerprint.h); INVALID_ARGUMENT when it does not describe `pool`
  // (layers, head_dim, block size, and kv_heads == pool heads * num_shards); the transport's error
  // when a registration fails. `seal` seals every descriptor (DescriptorSeal::None: unsealed).
  static absl::StatusOr<std::unique_ptr<KvReceiver>> Create(
      Transport& transport, KvPool& pool, estuary::v1::KvFormatFingerprint fingerprint,
      DescriptorSeal seal);
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  // The descriptor a prefill worker needs to push `request_id`'s prompt into `pages` (the
  // reservation's page ids in position order; the same ids on every shard), held until
  // `lease_deadline`, for the reservation named `epoch`; sealed.
  estuary::v1::TransferDescriptor Describe(const std::string& request_id,
                                           absl::Span<const int32_t> pages,
                                           absl::Time lease_deadline, uint64_t epoch) const;

  // Starts the polling thread. FAILED_PRECONDITION when already started (or stopped: a receiver
  // runs once).
  absl::Status Start(KvReceiverCallbacks callbacks);
  // Stops and joins the polling thread; idempotent.
  void Stop();

  const estuary::v1::KvFormatFingerprint& fingerprint() const { return fingerprint_; }
  // Completions and attaches handed to the callbacks / messages dropped so far.
  int64_t completions() const { return completions_.load(); }
  int64_t attaches() const { return attaches_.load(); }
  int64_t dropped_messages() const { return dropped_.load(); }

 private:
  KvReceiver(Transport& transport, KvPool& pool, estuary::v1::KvFormatFingerprint fingerprint,
             DescriptorSeal seal);
  // Describe without the seal (what the attach's digest covers).
  estuary::v1::TransferDescriptor Unsealed(const std::string& request_id,
                                           absl::Span<const int32_t> pages,
                                           absl::Time lease_deadline, uint64_t epoch) const;
  // OK when the attach carries the digest of the descriptor issued for its reservation.
  absl::Status CheckIssued(const estuary::v1::KvAttach& attach,
                           const KvReceiverCallbacks& callbacks) const;
  void Loop(const KvReceiverCallbacks& callbacks);
  void HandleAttach(const estuary::v1::KvAttach& attach, uint64_t sender,
                    const KvReceiverCallbacks& callbacks);

  Transport& transport_;
  KvPool& pool_;
  const estuary::v1::KvFormatFingerprint fingerprint_;
  const DescriptorSeal seal_;
  // [shard][layer]
  std::vector<std::vector<std::unique_ptr<RegisteredRegion>>> regions_;
  EndpointCache writers_;  // back to the writers, for attach replies (the receiver thread's)
  std::atomic<bool> stop_{false};
  absl::Mutex thread_mu_;  // serializes Start / Stop
  bool started_ ABSL_GUARDED_BY(thread_mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
  std::atomic<int64_t> completions_{0};
  std::atomic<int64_t> attaches_{0};
  std::atomic<int64_t> dropped_{0};
};

}  // namespace estuary::kvtransfer
