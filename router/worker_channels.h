#pragma once
// WorkerChannels: the router's channels to its workers, one per address
// (rpc::CreateClusterChannel: keepalive pings, cluster message limits), made on first use and
// shared by every call to that address. SendWorkerAbort: the fire-and-forget Abort the router
// sends a worker when a request ends early there. Thread-safe.

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "estuary/v1/worker.pb.h"
#include "grpcpp/grpcpp.h"

namespace estuary::router {

class WorkerChannels {
 public:
  std::shared_ptr<grpc::Channel> Get(const std::string& address);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// Asks the `role` worker behind `channel` to abort `request_id` (its Abort RPC, on gRPC's
// callback API, within `timeout`) and returns at once. The answer is not waited for: a worker
// that cannot be reached frees the request itself (its stream breaks, its lease ends).
void SendWorkerAbort(std::shared_ptr<grpc::Channel> channel, estuary::v1::WorkerRole role,
                     const std::string& request_id, absl::Duration timeout);

}  // namespace estuary::router
