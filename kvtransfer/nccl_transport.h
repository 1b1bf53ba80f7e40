#pragma once
// NcclTransport: the Transport interface for KV pages that live in GPU memory on both ends
// (design §7: "NCCL implementation for GPU pairs"). Puts move bytes GPU -> GPU with ncclSend /
// ncclRecv over a 2-rank NCCL communicator per endpoint; everything else (connection set-up,
// region keys, put headers, flush acks and the small messages of the Transport interface) goes
// over a control Transport that this transport wraps and owns (e.g. a UcxTransport over tcp).
//
// NCCL is two-sided, so a one-sided Put is emulated:
//   Connect     control Connect, then a HELLO carrying a fresh ncclUniqueId and this transport's
//               address; both sides join a 2-rank communicator (non-blocking
//               ncclCommInitRankConfig, bounded by the deadline; the connecting side is rank 0);
//               the accepting side connects back over the control transport and answers READY
//               (or FAIL with its reason).
//   Put         checks (bounds, `local` is device memory of this transport's device, else
//               INVALID_ARGUMENT), sends a put header {region key, offset, bytes, sequence} and
//               enqueues ncclSend. The accepting side has one thread per connection that takes the
//               headers in order and posts the matching ncclRecv into its registered region at
//               that offset; a header that names an unknown region or overruns it fails the
//               connection (both ends).
//   Flush       sends FLUSH {last sequence}; the receiver acks once every ncclRecv up to it has
//               completed on its stream; Flush returns after the ack and after this side's sends
//               completed (so `local` buffers may be reused).
//   Messages    user messages pass through the control transport unchanged (a payload that happens
//               to start with the protocol's 8-byte magic is escaped); a dispatcher thread takes
//               every control message, keeps the protocol's and queues the others for
//               PollMessage / ReceiveFrom.
//
// Regions are device memory: RegisterRegion takes a cudaMalloc'ed range of this transport's
// device (host memory: INVALID_ARGUMENT); AllocateRegion cudaMallocs (zeroed). Describe() carries
// the device address, the length and a key (rkey = "NCR1" + owner transport id + region key).
//
// Errors: as transport.h. Every wait has a deadline. A dead peer (the control endpoint's
// Health(), or the peer's FAIL message), an NCCL asynchronous error, a deadline passing while
// NCCL work is in flight, or a protocol violation aborts that endpoint's communicator
// (ncclCommAbort) and tells the peer (ABORT / FAIL) so that its side aborts too; the operation
// returns the cause (UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED) and the endpoint then stays failed:
// Health() and every later operation return UNAVAILABLE naming the cause. Other endpoints are not
// affected. A Flush deadline therefore costs the endpoint (an NCCL operation cannot be cancelled
// any other way); the EndpointCache reconnects for the next request.
//
// Threading: as transport.h. Threads owned by the transport: one dispatcher (reads the control
// transport's inbox) and one per accepted connection (posts receives, acks flushes). CUDA calls
// set this transport's device on the calling thread and restore the previous device.
//
// Ownership: the transport owns the control transport and the backend; regions and endpoints
// keep them alive. Destroying the transport stops the dispatcher, fails and aborts the accepted
// connections (their senders see UNAVAILABLE) and fails this transport's own endpoints.
//
// Limits: NCCL refuses two ranks of one communicator on the same GPU, so the two ends must use
// different devices (or hosts). Each endpoint costs a communicator (NCCL buffers and a proxy
// thread per peer), including endpoints made only to receive messages from a peer.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/nccl_transport_backend.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

struct NcclTransportOptions {
  int device = 0;  // CUDA device of the regions, the puts' sources and the communicators
  // Puts enqueued without a completed flush before Put waits for the oldest one to complete
  // (bounds the CUDA launch queue; a full queue would block the host inside ncclSend).
  size_t max_outstanding_puts = 256;
  // Accepting side: how long connecting back and joining the communicator may take.
  absl::Duration accept_timeout = absl::Seconds(30);
  // Accepting side: bound on sending an ack or a failure back to the sender.
  absl::Duration reply_timeout = absl::Seconds(5);
  // Destroying an endpoint: bound on the final flush and on the orderly communicator close.
  absl::Duration close_timeout = absl::Seconds(2);
};

class NcclTransport : public Transport {
 public:
  // Wraps `control` (owned; nobody else may read its messages). Creates the CUDA + NCCL backend on
  // options.device: FAILED_PRECONDITION without a usable CUDA device (or in a build without
  // ESTUARY_CUDA), INVALID_ARGUMENT for a null control transport or a device that does not exist.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(std::unique_ptr<Transport> control,
                                                               const NcclTransportOptions& options);
  // The same over any backend (the tests use FakeNcclBackend); options.device is not used.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> CreateWithBackend(
      std::unique_ptr<Transport> control, std::unique_ptr<nccl::Backend> backend,
      const NcclTransportOptions& options);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  std::string_view kind() const override { return "nccl"; }
  // The control transport's address (peers Connect to it; messages carry its id).
  const std::string& Address() const override { return address_; }
  // Device memory of options.device only (INVALID_ARGUMENT otherwise).
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> RegisterRegion(void* data,
                                                                   size_t bytes) override;
  // cudaMalloc + zero; the handle frees it (once no receive into it is in flight).
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> AllocateRegion(size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(std::string_view peer_address,
                                                    absl::Time deadline) override;
  absl::StatusOr<Message> PollMessage(absl::Time deadline) override;
  absl::StatusOr<Message> ReceiveFrom(const Endpoint& peer, absl::Time deadline) override;

  // Connections accepted from peers that are still open (for tests and metrics).
  size_t accepted_connections() const;

  class State;  // shared with endpoints, regions and the threads (nccl_transport.cc)

 private:
  explicit NcclTransport(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
  std::string address_;
};

}  // namespace estuary::kvtransfer
