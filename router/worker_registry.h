#pragma once
// WorkerRegistry: the router's table of live prefill and decode workers (design §1), and the
// placement policies that pick a (prefill, decode) pair for a request.
//
// Workers register (Register) and then heartbeat with their load figures; a worker whose last
// word is older than `worker_timeout` is dropped at the next look, one whose RPC failed
// with UNAVAILABLE is dropped at once (MarkDead), one that drains leaves (Unregister), and one
// whose load says `not_ready` stays known but gets no new work until it is ready again. Drops
// are counted in estuary:workers_dropped_total{reason}. A dropped worker that is still alive hears
// `known = false` on its next heartbeat and registers again.
//
// Placement (Policy):
//   - kRoundRobin: the next compatible worker of the role, in turn.
//   - kLeastLoaded: the lowest load; decode load = max(reported running + waiting + reserved
//     sequences, requests in flight through this router), prefill load = max(reported queued
//     prefill tokens, prompt tokens in flight through this router). Ties: more free KV pages,
//     then registration order.
//   - kPrefixAware: affinity by the hash of the prompt's leading full blocks (block_size tokens
//     each, up to kAffinityBlocks blocks, chained): the worker that last served the longest
//     matching prefix gets the request again (its prefix cache holds those pages), unless it is
//     kAffinityMaxImbalance requests busier than the least loaded one; otherwise, or when the
//     prompt has no full block, least loaded.
// A pair is only ever made of workers with the same KV format fingerprint and block size; an
// incompatible pair is never chosen.
//
// Every drop is also kept (the newest kMaxDroppedKept) for TakeDropped: the router ends or
// resumes the requests in flight on a dropped worker at once instead of waiting for their calls
// to fail (issue 14 item 1).
//
// Time is passed in (`now`), so tests drive expiry without sleeping. Thread-safe.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "estuary/v1/worker.pb.h"

namespace estuary::router {

enum class Policy { kRoundRobin, kLeastLoaded, kPrefixAware };

// "round_robin" | "least_loaded" | "prefix_aware"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Policy> ParsePolicy(const std::string& name);
std::string PolicyName(Policy policy);

// What every registering worker must agree with: the router's model.
struct ServedModel {
  std::string model_id;    // WorkerInfo.model_id must equal it
  int context_length = 0;  // WorkerInfo figures must equal these when the worker sets them
  int vocab_size = 0;
  int num_layers = 0;
};

struct RegistryOptions {
  absl::Duration worker_timeout = absl::Seconds(3);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  Policy policy = Policy::kLeastLoaded;
};

inline constexpr int kAffinityBlocks = 8;
inline constexpr int kAffinityMaxImbalance = 8;
inline constexpr size_t kAffinityTableMax = 1 << 16;  // entries per role; cleared when full

// A worker as placement sees it: a copy, safe to use after the registry changed.
struct WorkerView {
  estuary::v1::WorkerInfo info;
  estuary::v1::WorkerLoad load;
  int in_flight = 0;                // requests placed on it and not yet finished
  int64_t in_flight_tokens = 0;     // their prompt tokens (prefill load)
};

// A worker the registry let go of, and why: "unreachable" (MarkDead), "expired" (heartbeats
// missed), "unregistered" (it drains).
struct DroppedWorker {
  std::string worker_id;
  estuary::v1::WorkerRole role = estuary::v1::WORKER_ROLE_UNSPECIFIED;
  const char* reason = "";
};

// One request's placement. `prefill` is empty for local prefill on the decode worker.
struct Placement {
  WorkerView decode;
  std::optional<WorkerView> prefill;
};

class WorkerRegistry {
 public:
  WorkerRegistry(const ServedModel& model, const RegistryOptions& options);

  // Adds a worker, or refreshes one (same worker_id, address, role and identity: new info,
  // in-flight counts kept). ALREADY_EXISTS when the id is live at another address, in another
  // role or under another identity. INVALID_ARGUMENT for a malformed WorkerInfo,
  // FAILED_PRECONDITION for another model. `identity`: who registers (under mutual TLS the
  // worker's certificate identity, rpc/caller_identity.h; "" without): a live worker's id, and
  // its heartbeats and unregistration, stay with the identity that registered it.
  absl::Status Register(const estuary::v1::WorkerInfo& info, const estuary::v1::WorkerLoad& load,
                        absl::Time now, const std::string& identity = "");
  // False when the worker is unknown (never registered, expired or marked dead) or registered
  // under another identity.
  bool Heartbeat(const std::string& worker_id, const estuary::v1::WorkerLoad& load, absl::Time now,
                 const std::string& identity = "");
  // Drops the worker at once (its RPC failed with UNAVAILABLE). True when it was known.
  bool MarkDead(const std::string& worker_id);
  // The worker leaves (it drains). NOT_FOUND when it is not registered (or not under `identity`).
  absl::Status Unregister(const std::string& worker_id, const std::string& identity = "");

  // Live workers of `role` that are ready (load.not_ready unset; expired ones are dropped
  // first), in registration order. Placement only ever sees these.
  std::vector<WorkerView> Live(estuary::v1::WorkerRole role, absl::Time now);

  // Picks a decode worker, and unless `local` a compatible prefill worker, by the policy; counts
  // the request (and its prompt tokens) in flight on each (Release undoes it, one per worker).
  // `prompt` feeds the prefix affinity. Workers named in `avoid` (those that failed this request
  // already) are passed over while others of their role can serve. UNAVAILABLE when no decode
  // worker (or, unless `local`, no compatible pair) is live.
  absl::StatusOr<Placement> Choose(absl::Span<const int32_t> prompt, bool local, absl::Time now,
                                   absl::Span<const std::string> avoid = {});
  // The decode worker `worker_id` for a request it prefills itself (a sample placed beside an
  // earlier one of the same prompt), counted in flight like Choose. NOT_FOUND when that worker
  // is not live.
  absl::StatusOr<Placement> ChooseDecode(const std::string& worker_id,
                                         absl::Span<const int32_t> prompt, absl::Time now);
  // True when some live prefill worker is compatible with some live decode worker.
  bool HasCompatiblePair(absl::Time now);
  // Ends one request's count on a worker Choose returned (no-op when the worker is gone).
  void Release(const std::string& worker_id, int64_t prompt_tokens);

  // The workers dropped since the last call, oldest first (at most kMaxDroppedKept).
  std::vector<DroppedWorker> TakeDropped();
  // Drops the workers whose heartbeats are older than worker_timeout at `now` (every other call
  // does so too; this lets an owner notice expiry while no request comes).
  void Expire(absl::Time now);

  const RegistryOptions& options() const { return options_; }
  static constexpr size_t kMaxDroppedKept = 1024;

 private:
  struct Entry {
    estuary::v1::WorkerInfo info;
    std::string identity;  // who registered it (Register's `identity`)
    estuary::v1::WorkerLoad load;
    absl::Time last_seen;
    int64_t order = 0;  // registration order (re-registration keeps it)
    int in_flight = 0;
    int64_t in_flight_tokens = 0;
  };
  using AffinityTable = absl::flat_hash_map<uint64_t, std::string>;

  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the drop (estuary:workers_dropped_total{reason}) and keeps it for TakeDropped.
  void RecordDropLocked(const Entry& entry, const char* reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Entry*> LiveLocked(estuary::v1::WorkerRole role) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts one placed request (and its prompt tokens) in flight on `entry` (Release undoes it);
  // returns its view for the Placement.
  WorkerView CountInFlightLocked(Entry& entry, int64_t tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The policy's choice among `candidates` (non-empty).
  Entry* PickLocked(const std::vector<Entry*>& candidates, absl::Span<const int32_t> prompt,
                    int64_t* cursor, AffinityTable& affinity) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static WorkerView View(const Entry& entry);
  // `workers` less those named in `avoid`, unless that leaves none.
  static std::vector<Entry*> Avoiding(std::vector<Entry*> workers,
                                      absl::Span<const std::string> avoid);

  const ServedModel model_;
  const RegistryOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t decode_cursor_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefill_cursor_ ABSL_GUARDED_BY(mu_) = 0;
  AffinityTable decode_affinity_ ABSL_GUARDED_BY(mu_);
  AffinityTable prefill_affinity_ ABSL_GUARDED_BY(mu_);
  std::deque<DroppedWorker> dropped_ ABSL_GUARDED_BY(mu_);
};

// Whether two workers can form a pair: same KV format fingerprint and block size.
bool Compatible(const estuary::v1::WorkerInfo& a, const estuary::v1::WorkerInfo& b);

// Chained hashes of the prompt's leading full blocks: element i covers tokens
// [0, (i + 1) * block_size). At most `max_blocks` elements; empty when no block is full.
std::vector<uint64_t> PrefixBlockHashes(absl::Span<const int32_t> prompt, int block_size,
                                        int max_blocks);

}  // namespace estuary::router
