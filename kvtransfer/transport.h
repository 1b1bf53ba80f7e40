#pragma once
// Transport: the KV data plane between a prefill worker and a decode worker (design §7).
//
// The receiving side (decode) registers memory regions (one per layer of its KV pool, or per layer
// and TP shard) and sends their Describe() output to the sender in a TransferDescriptor
// (proto/estuary/v1/kv_transfer.proto). The sending side (prefill) Connect()s to the receiver's
// Address(), imports the described regions on that endpoint and does one-sided Put()s of
// contiguous chunks into them, then Flush()es and sends a small completion message.
//
// Errors (never a crash or a hang):
//   DEADLINE_EXCEEDED  a wait passed its deadline (every wait takes an absl::Time deadline);
//   UNAVAILABLE        the peer is gone (killed, closed, unreachable); the endpoint stays failed;
//   INVALID_ARGUMENT   a put outside the imported region, a malformed descriptor;
//   INTERNAL           any other transport library failure.
//
// Ownership: Transport owns its worker and the message inbox. RegisteredRegion and Endpoint are RAII
// handles; each keeps the transport's internals alive, so they may be destroyed in any order, but
// they are meant to be destroyed before the Transport. RemoteRegions are owned by the Endpoint that
// imported them and live as long as it does.
//
// Thread-safety: Transport methods may be called from any thread concurrently. An Endpoint is used
// by one thread at a time (a request's pusher); different endpoints may be used concurrently.
// RegisteredRegion is immutable after creation.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace estuary::kvtransfer {

// What a peer needs to put into a registered region: travels in KvRemoteRegion.
struct RegionDescriptor {
  uint64_t base = 0;   // virtual address of byte 0 in the owner's process
  uint64_t bytes = 0;  // length of the region
  std::string rkey;    // packed remote key; opaque, transport-specific
};

// A region of local memory registered with a transport so that peers can put into it.
// Destroying it deregisters the memory (and frees it when the transport allocated it).
class RegisteredRegion {
 public:
  virtual ~RegisteredRegion() = default;
  virtual void* data() const = 0;
  virtual size_t bytes() const = 0;
  virtual RegionDescriptor Describe() const = 0;
};

// A peer's region imported on one endpoint (an unpacked rkey). Owned by that Endpoint.
class RemoteRegion {
 public:
  virtual ~RemoteRegion() = default;
  virtual uint64_t base() const = 0;
  virtual uint64_t bytes() const = 0;
};

// A small control message (completion, abort), as received.
struct Message {
  uint64_t sender_id = 0;  // Transport::id() of the sender
  std::string payload;
};

// A connection to one peer transport. Destroying it flushes (bounded by a short timeout) and
// closes the connection; it never blocks indefinitely.
class Endpoint {
 public:
  virtual ~Endpoint() = default;

  // PeerId(address) of the peer this endpoint is connected to (matches Message::sender_id).
  virtual uint64_t peer_id() const = 0;

  // Imports a region the peer registered (from its Describe()). The returned pointer is owned by
  // this endpoint and valid until the endpoint is destroyed.
  virtual absl::StatusOr<const RemoteRegion*> ImportRegion(const RegionDescriptor& region) = 0;

  // One-sided write of `bytes` bytes from `local` to `dst` at `dst_offset`. Asynchronous: the data
  // is only known to have landed (and `local` may only be reused) after Flush() returns OK.
  // `deadline` bounds any wait for send resources, and nothing is posted once it has passed
  // (DEADLINE_EXCEEDED): a writer fenced by a lease passes its write deadline here (README
  // "Fencing"). INVALID_ARGUMENT when the chunk does not fit in `dst`; UNAVAILABLE when the peer is
  // gone.
  [[nodiscard]] virtual absl::Status Put(const void* local, size_t bytes, const RemoteRegion& dst,
                                         uint64_t dst_offset, absl::Time deadline) = 0;

  // Waits until every earlier Put() has completed at the peer (remotely visible).
  [[nodiscard]] virtual absl::Status Flush(absl::Time deadline) = 0;

  // Sends a small message (at most kMaxMessageBytes) to the peer's inbox. Ordered after the puts
  // only if Flush() was called in between. Returns once the payload buffer has been handed off.
  [[nodiscard]] virtual absl::Status SendMessage(std::string_view payload, absl::Time deadline) = 0;

  // OK while the connection is usable; UNAVAILABLE (with the reason) once the peer failed.
  virtual absl::Status Health() const = 0;
};

class Transport {
 public:
  // Largest payload SendMessage accepts.
  static constexpr size_t kMaxMessageBytes = 1 << 20;

  virtual ~Transport() = default;

  // "ucx" or "inproc" (TransferDescriptor.transport).
  virtual std::string_view kind() const = 0;
  // Opaque bytes a peer passes to Connect() (a ucp worker address for UCX).
  virtual const std::string& Address() const = 0;
  // PeerId(Address()): the sender id stamped on every message this transport sends.
  uint64_t id() const { return PeerId(Address()); }

  // Registers caller-owned memory [data, data + bytes); it must outlive the returned handle.
  virtual absl::StatusOr<std::unique_ptr<RegisteredRegion>> RegisterRegion(void* data,
                                                                           size_t bytes) = 0;
  // Allocates `bytes` of zeroed memory suited to this transport (for UCX it can be shared memory
  // that peers on the same host map directly) and registers it. The handle owns the memory.
  virtual absl::StatusOr<std::unique_ptr<RegisteredRegion>> AllocateRegion(size_t bytes) = 0;

  // Connects to a peer's Address(). Returns once the connection is usable, or an error by
  // `deadline` (UNAVAILABLE for a peer that is gone, DEADLINE_EXCEEDED when it did not answer).
  virtual absl::StatusOr<std::unique_ptr<Endpoint>> Connect(std::string_view peer_address,
                                                            absl::Time deadline) = 0;

  // The oldest message from any sender; DEADLINE_EXCEEDED when none arrived by `deadline`.
  virtual absl::StatusOr<Message> PollMessage(absl::Time deadline) = 0;
  // The oldest message from `peer`'s transport (one this transport connected to). UNAVAILABLE as
  // soon as `peer` fails (checked at least every 50 ms), DEADLINE_EXCEEDED at `deadline`.
  virtual absl::StatusOr<Message> ReceiveFrom(const Endpoint& peer, absl::Time deadline) = 0;

  // 64-bit id of a transport address (FNV-1a). Stable across processes.
  static uint64_t PeerId(std::string_view address);
};

// Messages received by one transport, queued per sender. Used by the implementations.
// Thread-safe. Holds at most `capacity` messages; beyond that new ones are dropped with a log line.
class MessageInbox {
 public:
  explicit MessageInbox(size_t capacity = 65536) : capacity_(capacity) {}

  void Push(Message message);
  // Oldest message from any sender; DEADLINE_EXCEEDED at `deadline`.
  absl::StatusOr<Message> Pop(absl::Time deadline);
  // Oldest message from `sender_id`; `health` is polled (every 50 ms, and on Wake()) and its error
  // is returned as soon as it is not OK.
  absl::StatusOr<Message> PopFrom(uint64_t sender_id, absl::Time deadline,
                                  const std::function<absl::Status()>& health);
  // Wakes waiters so that they re-check endpoint health.
  void Wake();

 private:
  const size_t capacity_;
  absl::Mutex mu_;
  uint64_t wake_generation_ ABSL_GUARDED_BY(mu_) = 0;
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Per sender: (arrival sequence, message), oldest first.
  absl::flat_hash_map<uint64_t, std::deque<std::pair<uint64_t, Message>>> queues_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary::kvtransfer
