#include "worker/worker_control.h"

namespace estuary::worker {

void WorkerControl::set_info(const estuary::v1::WorkerInfo& info) {
  absl::MutexLock lock(&mu_);
  info_ = info;
}

estuary::v1::WorkerInfo WorkerControl::info() const {
  absl::MutexLock lock(&mu_);
  return info_;
}

grpc::Status DrainingStatus() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the worker is shutting down (draining): place the request elsewhere");
}

grpc::Status ShutDownBeforeFinishStatus() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the worker shut down before the request finished (its --shutdown-timeout "
                      "passed)");
}

}  // namespace estuary::worker
