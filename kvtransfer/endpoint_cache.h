#pragma once
// EndpointCache: the connected endpoints of one process to its KV peers, shared by requests
// (README "Push protocol", step 3). The prefill side pushes through them (KvPusher); the decode
// side answers attaches through them (KvReceiver).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

// One connected endpoint shared by the requests that push from one src rank to one peer. Every
// operation on it takes its mutex (an Endpoint is used by one thread at a time: a rank thread's
// puts for one request may meet another request's flush from the engine thread). Immutable
// identity: when the endpoint fails, the cache makes a new CachedEndpoint; requests that used the
// old one keep it and see its failure.
class CachedEndpoint {
 public:
  explicit CachedEndpoint(std::unique_ptr<Endpoint> endpoint) : endpoint_(std::move(endpoint)) {}

  // Imports `region` once per endpoint (the decode worker registers its pool once, so every
  // request describes the same regions; re-importing per request would grow the endpoint).
  absl::StatusOr<const RemoteRegion*> Import(const RegionDescriptor& region);
  [[nodiscard]] absl::Status Put(const void* local, size_t bytes, const RemoteRegion& dst,
                                 uint64_t dst_offset, absl::Time deadline);
  [[nodiscard]] absl::Status Flush(absl::Time deadline);
  [[nodiscard]] absl::Status SendMessage(std::string_view payload, absl::Time deadline);
  absl::Status Health() const;

 private:
  mutable absl::Mutex mu_;
  std::unique_ptr<Endpoint> endpoint_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, const RemoteRegion*> imported_ ABSL_GUARDED_BY(mu_);
};

// Endpoints of one process, by (peer address, src rank), connected on first use and replaced
// when unhealthy. Thread-safe.
class EndpointCache {
 public:
  explicit EndpointCache(Transport& transport) : transport_(transport) {}

  // The healthy endpoint for (peer_address, src_rank), connecting (bounded by `deadline`) when
  // there is none or the cached one failed.
  absl::StatusOr<std::shared_ptr<CachedEndpoint>> Get(std::string_view peer_address, int src_rank,
                                                      absl::Time deadline);
  // Number of connections made so far (for tests and metrics).
  int64_t connects() const;

 private:
  struct Slot {
    absl::Mutex mu;  // held while connecting
    std::shared_ptr<CachedEndpoint> current ABSL_GUARDED_BY(mu);
  };
  Transport& transport_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::pair<std::string, int>, std::shared_ptr<Slot>> slots_
      ABSL_GUARDED_BY(mu_);
  int64_t connects_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace estuary::kvtransfer
