#pragma once
// InProcessTransport: the Transport interface over memcpy, for unit tests and single-process
// wiring. Transports in one process find each other through a process-wide registry keyed by
// Address() ("inproc:<n>"). Puts copy synchronously (Flush only checks the peer is alive);
// messages go straight into the peer's inbox. Destroying a transport makes every endpoint
// connected to it fail with UNAVAILABLE, which is how tests simulate a dead peer.
//
// Thread-safety: as Transport (transport.h). Puts into a region race with its deregistration only
// if the owner deregisters while peers still push, which the lease protocol forbids; the registry
// lock is held across each memcpy so that a put never writes into freed memory.

#include <memory>
#include <string>

#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

class InProcessTransport : public Transport {
 public:
  static std::unique_ptr<InProcessTransport> Create();
  ~InProcessTransport() override;

  std::string_view kind() const override { return "inproc"; }
  const std::string& Address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> RegisterRegion(void* data,
                                                                   size_t bytes) override;
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> AllocateRegion(size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(std::string_view peer_address,
                                                    absl::Time deadline) override;
  absl::StatusOr<Message> PollMessage(absl::Time deadline) override;
  absl::StatusOr<Message> ReceiveFrom(const Endpoint& peer, absl::Time deadline) override;

  struct State;  // shared with endpoints and regions (inprocess_transport.cc)

 private:
  explicit InProcessTransport(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
  std::string address_;
};

}  // namespace estuary::kvtransfer
