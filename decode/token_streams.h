#pragma once
// TokenStreams: the decode engine's token events, queued per request until the gRPC stream that
// serves the request takes them (design §1 step 4). The engine thread pushes; each Decode RPC
// handler waits on its own request. A stream is opened before its request can produce an event
// (at Reserve or local submit) so that nothing is lost when the RPC attaches late, and closed by
// the handler once it has sent the final event (or gave up). Thread-safe.

#include <deque>
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
  // INVALID_ARGUMENT when `request_id` is already open.
  absl::Status Open(const std::string& request_id);
  // Queues an event of an open request; events of unknown requests are dropped.
  void Push(const TokenEvent& event);
  // Every queued event of `request_id`, waiting until there is one or `deadline` passes (then
  // an empty vector). NOT_FOUND when the request is not open.
  absl::StatusOr<std::vector<TokenEvent>> Next(const std::string& request_id, absl::Time deadline);
  void Close(const std::string& request_id);
  bool IsOpen(const std::string& request_id) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::deque<TokenEvent>> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary
