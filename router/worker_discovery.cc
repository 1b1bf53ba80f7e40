#include "router/worker_discovery.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "rpc/channels.h"
#include "rpc/status_convert.h"

namespace estuary::router {
namespace {

bool Unreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

}  // namespace

absl::StatusOr<DiscoveryTarget> ParseDiscoveryTarget(const std::string& text) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--discover-workers entry '", text, "': ", why, " (expected NAME:PORT)"));
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no name and port");
  DiscoveryTarget target;
  target.name = text.substr(0, colon);
  if (target.name.front() == '[') {
    if (target.name.size() < 3 || target.name.back() != ']') return bad("unbalanced brackets");
    target.name = target.name.substr(1, target.name.size() - 2);
  } else if (target.name.find(':') != std::string::npos) {
    return bad("an IPv6 address needs brackets");
  }
  if (!absl::SimpleAtoi(text.substr(colon + 1), &target.port) || target.port < 1 ||
      target.port > 65535) {
    return bad("the port must be in [1, 65535]");
  }
  for (char c : target.name) {
    if (std::isspace(static_cast<unsigned char>(c))) return bad("the name has whitespace");
  }
  return target;
}

absl::StatusOr<std::vector<std::string>> ResolveTarget(const DiscoveryTarget& target) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(target.name.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", target.name, "': ", ::gai_strerror(rc)));
  }
  std::set<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char host[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), nullptr, 0,
                      NI_NUMERICHOST) == 0) {
      addresses.insert(HostPort(host, target.port));
    }
  }
  ::freeaddrinfo(found);
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

WorkerDiscovery::WorkerDiscovery(WorkerRegistry& registry, DiscoveryOptions options)
    : registry_(registry), options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

WorkerDiscovery::~WorkerDiscovery() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int64_t WorkerDiscovery::rounds() const {
  absl::MutexLock lock(&mu_);
  return rounds_;
}

void WorkerDiscovery::Run() {
  while (true) {
    const absl::Time next = absl::Now() + options_.interval;
    Round();
    absl::MutexLock lock(&mu_);
    ++rounds_;
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithDeadline(absl::Condition(&stopping), next);
    if (stop_) return;
  }
}

void WorkerDiscovery::Round() {
  std::set<std::string> seen;
  for (const DiscoveryTarget& target : options_.targets) {
    absl::StatusOr<std::vector<std::string>> addresses = ResolveTarget(target);
    std::string& last_error = resolve_errors_[target.name];
    if (!addresses.ok()) {
      // A Service with no ready pod has no records: its workers expire from the registry.
      if (last_error != addresses.status().message()) {
        ESTUARY_LOG(WARNING) << "worker discovery: " << addresses.status();
        last_error = std::string(addresses.status().message());
      }
      continue;
    }
    last_error.clear();
    seen.insert(addresses->begin(), addresses->end());
  }
  // Forget the addresses that left the answers; their workers expire (no more heartbeats).
  for (auto it = known_.begin(); it != known_.end();) {
    auto next = std::next(it);
    if (!seen.count(it->first)) known_.erase(it);
    it = next;
  }
  std::vector<std::thread> probes;
  probes.reserve(seen.size());
  for (const std::string& address : seen) {
    Known& known = known_[address];  // node-stable across the round: no insertion during it
    probes.emplace_back([this, &address, &known] { Probe(address, known); });
  }
  for (std::thread& probe : probes) probe.join();
}

void WorkerDiscovery::Probe(const std::string& address, Known& known) {
  std::shared_ptr<grpc::Channel> channel = ChannelTo(address);
  auto deadline = [this] { return absl::ToChronoTime(absl::Now() + options_.probe_timeout); };
  auto unreachable = [&](const char* call, const grpc::Status& status) {
    if (known.have_info && registry_.MarkDead(known.info.worker_id())) {
      ESTUARY_LOG(WARNING) << "worker discovery: " << call << " on " << address << " failed ("
                           << rpc::FromGrpcStatus(status) << "); dropped "
                           << known.info.worker_id();
    }
    known.have_info = false;
  };
  if (!known.have_info) {
    // A worker serves one role: DecodeWorker, else PrefillWorker.
    grpc::Status status;
    for (int attempt = 0; attempt < 2; ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(deadline());
      status = attempt == 0 ? estuary::v1::DecodeWorker::NewStub(channel)->GetInfo(
                                  &context, {}, &known.info)
                            : estuary::v1::PrefillWorker::NewStub(channel)->GetInfo(
                                  &context, {}, &known.info);
      if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED) break;
    }
    if (!status.ok()) {
      if (!Unreachable(status) && !known.refused_logged) {
        ESTUARY_LOG(WARNING) << "worker discovery: GetInfo on " << address << ": "
                             << rpc::FromGrpcStatus(status);
        known.refused_logged = true;
      }
      return;
    }
    // An empty id: the worker is still starting (it fills its info once it serves).
    if (known.info.worker_id().empty()) return;
    known.have_info = true;
    known.refused_logged = false;
  }
  grpc::ClientContext context;
  context.set_deadline(deadline());
  estuary::v1::WorkerLoad load;
  const grpc::Status status =
      known.info.role() == estuary::v1::WORKER_ROLE_PREFILL
          ? estuary::v1::PrefillWorker::NewStub(channel)->GetLoad(&context, {}, &load)
          : estuary::v1::DecodeWorker::NewStub(channel)->GetLoad(&context, {}, &load);
  if (!status.ok()) {
    unreachable("GetLoad", status);
    return;
  }
  const absl::Time now = absl::Now();
  if (registry_.Heartbeat(known.info.worker_id(), load, now)) return;
  if (absl::Status registered = registry_.Register(known.info, load, now); !registered.ok()) {
    if (!known.refused_logged) {
      ESTUARY_LOG(WARNING) << "worker discovery: refused the worker at " << address << ": "
                           << registered;
      known.refused_logged = true;
    }
    return;
  }
  ESTUARY_LOG(INFO) << "worker discovery: " << known.info.worker_id() << " at " << address
                    << " joined";
}

std::shared_ptr<grpc::Channel> WorkerDiscovery::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&channels_mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) channel = rpc::CreateClusterChannel(address);
  return channel;
}

}  // namespace estuary::router
