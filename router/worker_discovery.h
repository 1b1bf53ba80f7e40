#pragma once
// WorkerDiscovery: finds workers by name for routers that run as several replicas. A worker that
// registers through a Service reaches one router replica only; a headless Service's name
// resolves to every ready pod instead, so each router resolves the names itself
// (--discover-workers NAME:PORT,...), asks each address what it is (GetInfo on the DecodeWorker,
// else the PrefillWorker service) and probes it with GetLoad every interval, feeding the
// answers into the router's WorkerRegistry as Register / Heartbeat would. Registration stays for
// setups without DNS; both can feed one registry.
//
//   - a name is re-resolved every interval (getaddrinfo: A and AAAA records, or a hosts file);
//     an address that leaves the answer is no longer probed, and its worker expires from the
//     registry after --worker-timeout like a worker that stopped heartbeating;
//   - a probe that fails with UNAVAILABLE or DEADLINE_EXCEEDED drops the worker at once
//     (WorkerRegistry::MarkDead, logged and counted as unreachable); it is asked GetInfo again
//     on the next round, so a restarted pod at the same address comes back;
//   - a worker whose info the registry refuses (another model, a malformed info) is logged once
//     per address and skipped.
// Probes of one round run in parallel, each bounded by `probe_timeout`, so one vanished host
// does not delay the others. Owns its thread and its channels; the registry must outlive it.

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "estuary/v1/worker.pb.h"
#include "grpcpp/grpcpp.h"
#include "router/worker_registry.h"

namespace estuary::router {

// One --discover-workers entry.
struct DiscoveryTarget {
  std::string name;  // a DNS name or an address
  int port = 0;
};

// Parses "NAME:PORT" ("[v6]:PORT" for an IPv6 literal). INVALID_ARGUMENT naming the entry.
absl::StatusOr<DiscoveryTarget> ParseDiscoveryTarget(const std::string& text);

// The addresses `target` resolves to now, as "host:port" strings (IPv6 bracketed), sorted and
// without duplicates. UNAVAILABLE with the resolver's message when the name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveTarget(const DiscoveryTarget& target);

struct DiscoveryOptions {
  std::vector<DiscoveryTarget> targets;
  absl::Duration interval = absl::Milliseconds(500);  // resolve and probe this often
  absl::Duration probe_timeout = absl::Seconds(1);    // per GetInfo / GetLoad call
};

class WorkerDiscovery {
 public:
  // Starts the thread (the first round runs at once).
  WorkerDiscovery(WorkerRegistry& registry, DiscoveryOptions options);
  ~WorkerDiscovery();  // stops and joins
  WorkerDiscovery(const WorkerDiscovery&) = delete;
  WorkerDiscovery& operator=(const WorkerDiscovery&) = delete;

  // Rounds completed so far (tests wait on it).
  int64_t rounds() const;

 private:
  // What discovery knows about one address.
  struct Known {
    bool have_info = false;
    estuary::v1::WorkerInfo info;
    bool refused_logged = false;  // a refusal or a GetInfo error was logged for this address
  };
  void Run();
  void Round();
  // GetInfo then GetLoad on one address; updates the registry.
  void Probe(const std::string& address, Known& known);
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  WorkerRegistry& registry_;
  const DiscoveryOptions options_;
  // Touched only by the discovery thread and the probes it joins each round (a std::map: each
  // probe holds a reference to its entry while the round runs).
  std::map<std::string, Known> known_;
  std::map<std::string, std::string> resolve_errors_;  // per name: the last one logged
  absl::Mutex channels_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(channels_mu_);
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace estuary::router
