#pragma once
// RegistrationClient: the worker side of the router's WorkerRegistry (worker.proto). A worker
// binary starts one after its gRPC server serves:
//
//   estuary::router::RegistrationClient registration;
//   estuary::v1::WorkerInfo info;            // worker_id, role, advertised address, model_id,
//   ...                                      // tp_size, block_size, fingerprint, context_length,
//                                            // vocab_size, num_layers
//   registration.Start(router_address, info, [&] {
//     estuary::v1::WorkerLoad load;
//     service->GetLoad(nullptr, nullptr, &load);  // the same figures GetLoad answers
//     return load;
//   });
//   ... serve ...
//   registration.Stop();                     // or let the destructor do it
//
// Its thread registers (retrying every `retry_interval` until the router answers), then sends a
// heartbeat with fresh load figures every interval the router asked for (and at once when
// Nudge()d: the worker's readiness changed), and registers again
// when the router answers `known = false` (it forgot the worker: expiry, a restart, or an
// UNAVAILABLE seen by the router). A router that refuses the worker (a wrong model, a malformed
// WorkerInfo, no or another cluster token) is logged and retried with backoff, never fatal to
// the worker. Its calls carry the cluster's credentials (rpc/cluster_security.h).
//
// Depends on worker_proto, rpc (channels), gRPC and core/common (logging) only.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "estuary/v1/worker.pb.h"

namespace estuary::worker {

struct RegistrationClientOptions {
  std::chrono::milliseconds retry_interval{200};    // between attempts while unregistered
  std::chrono::milliseconds refused_backoff{5000};  // after the router refused the worker
  std::chrono::milliseconds rpc_timeout{1000};      // per Register / Heartbeat call
};

// A worker id unique per advertised address: "<role>@<address>", e.g. "decode@10.0.0.7:50051".
std::string DefaultWorkerId(estuary::v1::WorkerRole role, const std::string& address);

class RegistrationClient {
 public:
  using LoadFn = std::function<estuary::v1::WorkerLoad()>;

  RegistrationClient() = default;
  explicit RegistrationClient(const RegistrationClientOptions& options) : options_(options) {}
  ~RegistrationClient();  // Stop()
  RegistrationClient(const RegistrationClient&) = delete;
  RegistrationClient& operator=(const RegistrationClient&) = delete;

  // Starts the thread. `load` is called on that thread before each Register and Heartbeat.
  // Calling Start twice without Stop is a programmer error (ignored with a warning).
  void Start(const std::string& router_address, const estuary::v1::WorkerInfo& info, LoadFn load);
  // Stops the thread and joins it (returns within about one rpc_timeout). Idempotent.
  void Stop();
  // Sends the next heartbeat now rather than at the end of the interval (the worker's
  // readiness changed). Thread-safe; a no-op before Start.
  void Nudge();
  // Stop(), then tells the router this worker leaves (Unregister, one rpc_timeout at most), so
  // that it places nothing new here while the worker drains. No-op when never started.
  void Unregister();

  // Whether the router currently knows this worker (as of the last answer).
  bool registered() const { return registered_.load(); }
  // Successful Register calls so far (the first one and every re-registration).
  int registrations() const { return registrations_.load(); }

 private:
  void Run(std::string router_address, estuary::v1::WorkerInfo info, LoadFn load);
  // Waits `duration` or until Stop(); false when stopping.
  bool Sleep(std::chrono::milliseconds duration);

  const RegistrationClientOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;    // under mu_
  bool nudged_ = false;  // under mu_
  std::thread thread_;
  std::string router_address_;  // set by Start
  std::string worker_id_;
  std::atomic<bool> registered_{false};
  std::atomic<int> registrations_{0};
};

}  // namespace estuary::worker
