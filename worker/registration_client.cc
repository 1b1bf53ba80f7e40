#include "worker/registration_client.h"

#include <algorithm>

#include "core/common/logging.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "rpc/channels.h"

namespace estuary::worker {
namespace {

constexpr std::chrono::milliseconds kDefaultHeartbeat{500};
constexpr std::chrono::milliseconds kMinHeartbeat{20};
constexpr std::chrono::milliseconds kMaxHeartbeat{60000};

std::chrono::system_clock::time_point DeadlineIn(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

bool Refused(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT ||
         code == grpc::StatusCode::FAILED_PRECONDITION ||
         code == grpc::StatusCode::UNIMPLEMENTED || code == grpc::StatusCode::PERMISSION_DENIED ||
         code == grpc::StatusCode::UNAUTHENTICATED;  // no or another cluster token
}

}  // namespace

std::string DefaultWorkerId(estuary::v1::WorkerRole role, const std::string& address) {
  const char* name = role == estuary::v1::WORKER_ROLE_PREFILL  ? "prefill"
                     : role == estuary::v1::WORKER_ROLE_DECODE ? "decode"
                                                               : "worker";
  return std::string(name) + "@" + address;
}

RegistrationClient::~RegistrationClient() { Stop(); }

void RegistrationClient::Start(const std::string& router_address,
                               const estuary::v1::WorkerInfo& info, LoadFn load) {
  if (thread_.joinable()) {
    ESTUARY_LOG(WARNING) << "RegistrationClient::Start called twice; ignored";
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
  }
  router_address_ = router_address;
  worker_id_ = info.worker_id();
  thread_ = std::thread([this, router_address, info, load = std::move(load)]() mutable {
    Run(std::move(router_address), std::move(info), std::move(load));
  });
}

void RegistrationClient::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  registered_ = false;
}

void RegistrationClient::Unregister() {
  Stop();
  if (router_address_.empty()) return;
  auto stub = estuary::v1::WorkerRegistry::NewStub(rpc::CreateClusterChannel(router_address_));
  estuary::v1::UnregisterRequest request;
  request.set_worker_id(worker_id_);
  estuary::v1::UnregisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(options_.rpc_timeout));
  const grpc::Status status = stub->Unregister(&context, request, &response);
  if (status.ok()) {
    ESTUARY_LOG(INFO) << "unregistered " << worker_id_ << " from the router at " << router_address_;
  } else {
    ESTUARY_LOG(WARNING) << "unregistering " << worker_id_ << " from the router at "
                         << router_address_ << " failed (it will expire instead): "
                         << status.error_message();
  }
}

void RegistrationClient::Nudge() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    nudged_ = true;
  }
  cv_.notify_all();
}

bool RegistrationClient::Sleep(std::chrono::milliseconds duration) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, duration, [this] { return stop_ || nudged_; });
  nudged_ = false;
  return !stop_;
}

void RegistrationClient::Run(std::string router_address, estuary::v1::WorkerInfo info,
                             LoadFn load) {
  auto stub = estuary::v1::WorkerRegistry::NewStub(
      rpc::CreateClusterChannel(router_address));
  std::chrono::milliseconds interval = kDefaultHeartbeat;
  bool warned_unreachable = false;
  std::string last_refusal;
  while (true) {
    if (!registered_) {
      estuary::v1::RegisterRequest request;
      *request.mutable_info() = info;
      if (load) *request.mutable_load() = load();
      estuary::v1::RegisterResponse response;
      grpc::ClientContext context;
      context.set_deadline(DeadlineIn(options_.rpc_timeout));
      const grpc::Status status = stub->Register(&context, request, &response);
      if (status.ok()) {
        registered_ = true;
        ++registrations_;
        warned_unreachable = false;
        last_refusal.clear();
        interval = response.heartbeat_interval_ms() > 0
                       ? std::clamp(std::chrono::milliseconds(response.heartbeat_interval_ms()),
                                    kMinHeartbeat, kMaxHeartbeat)
                       : kDefaultHeartbeat;
        ESTUARY_LOG(INFO) << "registered with the router at " << router_address << " as "
                          << info.worker_id() << " (heartbeat every " << interval.count()
                          << " ms)";
        if (!Sleep(interval)) return;
      } else if (Refused(status.error_code())) {
        if (status.error_message() != last_refusal) {
          ESTUARY_LOG(ERROR) << "the router at " << router_address << " refused worker "
                             << info.worker_id() << ": " << status.error_message();
          last_refusal = status.error_message();
        }
        if (!Sleep(options_.refused_backoff)) return;
      } else {
        if (!warned_unreachable) {
          ESTUARY_LOG(WARNING) << "router at " << router_address << " not reachable yet ("
                               << status.error_message() << "); retrying every "
                               << options_.retry_interval.count() << " ms";
          warned_unreachable = true;
        }
        if (!Sleep(options_.retry_interval)) return;
      }
      continue;
    }
    estuary::v1::HeartbeatRequest request;
    request.set_worker_id(info.worker_id());
    if (load) *request.mutable_load() = load();
    estuary::v1::HeartbeatResponse response;
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(options_.rpc_timeout));
    const grpc::Status status = stub->Heartbeat(&context, request, &response);
    if (status.ok() && !response.known()) {
      ESTUARY_LOG(WARNING) << "the router at " << router_address << " forgot worker "
                           << info.worker_id() << "; registering again";
      registered_ = false;
      continue;  // at once
    }
    if (!status.ok() && !warned_unreachable) {
      ESTUARY_LOG(WARNING) << "heartbeat to the router at " << router_address
                           << " failed: " << status.error_message();
      warned_unreachable = true;
    } else if (status.ok()) {
      warned_unreachable = false;
    }
    if (!Sleep(status.ok() ? interval : std::min(interval, options_.retry_interval))) return;
  }
}

}  // namespace estuary::worker
