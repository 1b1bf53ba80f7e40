#pragma once
// Admission: the router's two caps on Generate calls, checked before any work is done on a
// request (validation and tokenizing included), so that a burst beyond them is refused in
// microseconds and costs the router nothing (issue 14, item 6; reliability C4, C14).
//
//   - --max-concurrent-streams: calls at once, in any state (queued, streaming). Each holds one
//     of the gRPC server's threads for as long as it runs; the server's thread quota sits above
//     this cap (rpc::ServerLimits), so this refusal, naming the flag, comes first.
//   - --max-queued-requests: calls not yet streaming (placement, reservation, prefill).
//
// A Ticket holds one stream, and one queue place until LeaveQueue (the first token) or its
// end. Thread-safe.

#include <atomic>
#include <utility>

#include "absl/status/statusor.h"

namespace estuary::router {

class Admission {
 public:
  Admission(int max_streams, int max_queued) : max_streams_(max_streams), max_queued_(max_queued) {}

  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    // True the first time (the ticket was queued), false afterwards.
    bool LeaveQueue();

   private:
    friend class Admission;
    explicit Ticket(Admission* owner) : owner_(owner), queued_(true) {}
    void Release();
    Admission* owner_ = nullptr;
    bool queued_ = false;
  };

  // A ticket, or RESOURCE_EXHAUSTED naming the cap that refused.
  absl::StatusOr<Ticket> Admit();

  int streams() const { return streams_.load(); }
  int queued() const { return queued_.load(); }

 private:
  const int max_streams_;
  const int max_queued_;
  std::atomic<int> streams_{0};
  std::atomic<int> queued_{0};
};

}  // namespace estuary::router
