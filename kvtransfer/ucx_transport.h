#pragma once
// UcxTransport: the Transport interface over UCX ucp (design §7).
//
//  - One ucp context (features RMA + AM + WAKEUP) and one worker per transport.
//  - Registered regions: ucp_mem_map + ucp_rkey_pack (Describe() carries the packed rkey);
//    AllocateRegion lets UCX allocate the memory, so shared-memory transports (posix) can map it
//    in the peer and puts become a plain memcpy.
//  - Endpoints: ucp_ep_create from the peer's worker address with UCP_ERR_HANDLING_MODE_PEER, so a
//    dead peer gives an error callback (endpoint -> UNAVAILABLE), not a hang. Keepalive is set by
//    UcxTransportOptions::keepalive_interval (it is what notices a dead peer over shared memory).
//  - Puts: ucp_put_nbx (rkeys unpacked per endpoint with ucp_ep_rkey_unpack); Flush:
//    ucp_ep_flush_nbx. Messages: ucp_am_send_nbx (eager) with the sender id as AM header,
//    received by a ucp_worker_set_am_recv_handler callback into a MessageInbox.
//
// Threading: the worker is created with UCS_THREAD_MODE_MULTI (UCX serializes calls with its
// worker lock). A progress thread owned by the transport drives the worker when nobody else does:
// it sleeps on the worker's event fd (ucp_worker_arm + poll), or spins when `busy_poll` is set.
// Callers that wait (Connect, Flush, SendMessage, endpoint close) progress the worker themselves
// until their request completes or their deadline passes, so a wait never depends on the progress
// thread waking up. All UCX handles are held by RAII wrappers; endpoints and regions share
// ownership of the worker state, so destruction order cannot free the worker under them.
//
// Which UCX transports are used: `tls` (UCX_TLS syntax: "tcp", "sm", "posix,cma", ...) when set,
// otherwise UCX's own default, which honours the UCX_TLS environment variable.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

struct UcxTransportOptions {
  std::string tls;  // UCX_TLS for this transport; empty: UCX default / environment
  // Progress thread spins (lowest latency, burns a core) instead of sleeping on the event fd.
  bool busy_poll = false;
  // UCX keepalive: how soon a silent dead peer is noticed. Zero keeps UCX's default (20 s).
  absl::Duration keepalive_interval = absl::Milliseconds(500);
  // UCP_ERR_HANDLING_MODE_PEER on endpoints (a dead peer fails the endpoint instead of hanging).
  // UCX 1.13's shared-memory transports (posix, sysv) have no peer failure handler, so with PEER
  // mode they cannot carry active messages: use "sm,tcp" (messages over tcp, RMA over cma/sm), or
  // turn this off for pure "sm" and rely on deadlines alone to notice a dead peer.
  bool peer_error_handling = true;
  // Puts go over a second endpoint to the same peer, created with UCP_ERR_HANDLING_MODE_NONE so
  // that UCX 1.13 may pick shared-memory RMA lanes (posix/cma) for it; messages and peer-failure
  // detection stay on the first endpoint (PEER mode, e.g. over tcp). Use with tls "sm,tcp".
  bool separate_data_endpoint = false;
  // Any other ucp configuration (name without the UCX_ prefix, value), e.g. {"RNDV_THRESH", "8k"}.
  std::vector<std::pair<std::string, std::string>> extra_config;
};

class UcxTransport : public Transport {
 public:
  // INTERNAL when UCX cannot be initialized (e.g. an unknown transport in `tls`).
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxTransportOptions& options);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string_view kind() const override { return "ucx"; }
  const std::string& Address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> RegisterRegion(void* data,
                                                                   size_t bytes) override;
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> AllocateRegion(size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(std::string_view peer_address,
                                                    absl::Time deadline) override;
  absl::StatusOr<Message> PollMessage(absl::Time deadline) override;
  absl::StatusOr<Message> ReceiveFrom(const Endpoint& peer, absl::Time deadline) override;

  class Worker;  // context + worker + progress thread + inbox (ucx_transport.cc)

 private:
  explicit UcxTransport(std::shared_ptr<Worker> worker);
  std::shared_ptr<Worker> worker_;
  std::string address_;
};

}  // namespace estuary::kvtransfer
