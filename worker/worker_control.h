#pragma once
// WorkerControl: the state a worker process's plumbing (worker_process.h) shares with its role's
// gRPC service (DecodeService, PrefillService). The plumbing writes it; the service reads it on
// gRPC threads:
//   - ready: readiness (model loaded, engine loop running and healthy, not draining); the
//     service reports it to routers as WorkerLoad.not_ready;
//   - draining: SIGTERM came; new work (Reserve, a local-prefill Decode, Prefill) is refused
//     with UNAVAILABLE, which routers retry elsewhere; work already placed goes on;
//   - ending: the drain ran past --shutdown-timeout; handlers still running end their
//     requests with UNAVAILABLE and return;
//   - info: the WorkerInfo the worker registers with (GetInfo answers it).

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "estuary/v1/worker.pb.h"
#include "grpcpp/support/status.h"

namespace estuary::worker {

class WorkerControl {
 public:
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::atomic<bool> ending{false};

  void set_info(const estuary::v1::WorkerInfo& info);
  estuary::v1::WorkerInfo info() const;

 private:
  mutable absl::Mutex mu_;
  estuary::v1::WorkerInfo info_ ABSL_GUARDED_BY(mu_);
};

// What a service answers for new work while draining (UNAVAILABLE: routers retry elsewhere).
grpc::Status DrainingStatus();
// What a request still in flight ends with once the drain ran past --shutdown-timeout.
grpc::Status ShutDownBeforeFinishStatus();

}  // namespace estuary::worker
