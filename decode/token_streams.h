#pragma once
// TokenStreams: the decode engine's token events, queued per request until the gRPC stream that
// serves the request takes them (design §1 step 4). The engine thread pushes; each Decode RPC
// handler waits on its own request. A stream is opened before its request can produce an event
// (at Reserve or local submit) so that nothing is lost when the RPC attaches late, and closed by
// the handler once it has sent the final event (or gave up). A stream whose request ended but
// that no handler ever closed (the client never attached, e.g. a reservation whose prefill
// failed) is dropped `unclaimed_ttl` after its final event, so such streams cannot pile up.
// Thread-safe.

#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "decode/decode_request.h"

namespace estuary {

class TokenStreams {
 public:
  // At most `max_open` streams are open at once (the worker's bound on requests in flight).
  explicit TokenStreams(absl::Duration unclaimed_ttl = absl::Minutes(1),
                        size_t max_open = std::numeric_limits<size_t>::max())
      : unclaimed_ttl_(unclaimed_ttl), max_open_(max_open) {}

  // INVALID_ARGUMENT when `request_id` is already open; RESOURCE_EXHAUSTED when max_open
  // streams are.
  absl::Status Open(const std::string& request_id);
  // Queues an event of an open request; events of unknown requests are dropped.
  void Push(const TokenEvent& event);
  // Every queued event of `request_id`, waiting until there is one or `deadline` passes (then
  // an empty vector). NOT_FOUND when the request is not open.
  absl::StatusOr<std::vector<TokenEvent>> Next(const std::string& request_id, absl::Time deadline);
  void Close(const std::string& request_id);
  bool IsOpen(const std::string& request_id) const;
  size_t open_streams() const;

 private:
  struct Stream {
    std::deque<TokenEvent> events;
    absl::Time finished_at = absl::InfiniteFuture();  // when its final event was pushed
  };
  // Drops streams finished more than unclaimed_ttl_ ago.
  void DropUnclaimed(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration unclaimed_ttl_;
  const size_t max_open_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Stream> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary
