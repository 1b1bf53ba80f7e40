#pragma once
// AttachReplies: the prefill process's end of the attach handshake (README "Fencing"). A KvPusher
// sends a KvAttach to the decode worker before its first put and must not put before the decode
// worker said yes; the answers (KvAttachReply) arrive in the prefill transport's inbox, for all
// requests at once. One thread here takes every message the transport receives and files each
// reply under (request id, epoch) for the pusher waiting on it.
//
// Ownership: borrows the Transport, which must outlive this object; it must be the only
// consumer of that transport's PollMessage (anything but an attach reply is dropped and
// counted). Threading: Expect / Await / Forget from any thread; the thread is joined by the
// destructor (within about kPollSlice).

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

class AttachReplies {
 public:
  static constexpr absl::Duration kPollSlice = absl::Milliseconds(20);

  explicit AttachReplies(Transport& transport);
  ~AttachReplies();
  AttachReplies(const AttachReplies&) = delete;
  AttachReplies& operator=(const AttachReplies&) = delete;

  // Makes room for the reply to (request_id, epoch); call before sending the attach, so that a
  // fast reply is never dropped as unexpected.
  void Expect(const std::string& request_id, uint64_t epoch);
  // The decode worker's answer (OK: the writer may push; its refusal otherwise), after which the
  // entry is forgotten; or DEADLINE_EXCEEDED when none came by `deadline` (the entry stays, to be
  // awaited again or forgotten); FAILED_PRECONDITION when the entry was never expected.
  absl::Status Await(const std::string& request_id, uint64_t epoch, absl::Time deadline);
  // Drops an expected entry that will not be awaited (the attach could not be sent).
  void Forget(const std::string& request_id, uint64_t epoch);

  // Messages dropped: malformed, not an attach reply, or a reply nobody expects.
  int64_t dropped() const { return dropped_.load(); }

 private:
  void Loop();

  Transport& transport_;
  absl::Mutex mu_;
  // Expected replies; nullopt until the reply arrives.
  absl::flat_hash_map<std::pair<std::string, uint64_t>, std::optional<absl::Status>> replies_
      ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> dropped_{0};
  std::thread thread_;  // last: started when everything else is ready
};

}  // namespace estuary::kvtransfer
