#include "router/worker_registry.h"

#include <algorithm>
#include <deque>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/metrics.h"
#include "google/protobuf/util/message_differencer.h"

namespace estuary::router {
namespace {

using estuary::v1::WorkerInfo;
using estuary::v1::WorkerRole;

std::string RoleName(WorkerRole role) {
  switch (role) {
    case estuary::v1::WORKER_ROLE_PREFILL:
      return "prefill";
    case estuary::v1::WORKER_ROLE_DECODE:
      return "decode";
    default:
      return "unspecified";
  }
}

// FNV-1a over 32-bit token ids, continuing from `seed`.
uint64_t HashTokens(uint64_t seed, absl::Span<const int32_t> tokens) {
  uint64_t h = seed;
  for (int32_t t : tokens) {
    uint32_t v = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// estuary:workers_dropped_total{reason}: workers the registry let go of, and why.
void CountDrop(const char* reason) {
  common::MetricsRegistry::Global()
      .GetCounter("estuary:workers_dropped_total",
                  "Workers dropped from the router's registry: unreachable (a call or probe "
                  "failed), expired (heartbeats missed), unregistered (drained).",
                  {{"reason", reason}})
      .Increment();
}

absl::Status CheckFigure(const char* field, int worker_value, int router_value) {
  if (worker_value != 0 && router_value != 0 && worker_value != router_value) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", field, " = ", worker_value, " differs from the router's model (", router_value,
        ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Policy> ParsePolicy(const std::string& name) {
  if (name == "round_robin") return Policy::kRoundRobin;
  if (name == "least_loaded") return Policy::kLeastLoaded;
  if (name == "prefix_aware") return Policy::kPrefixAware;
  return absl::InvalidArgumentError(absl::StrCat(
      "--policy = '", name, "' is not one of round_robin, least_loaded, prefix_aware"));
}

std::string PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kRoundRobin:
      return "round_robin";
    case Policy::kLeastLoaded:
      return "least_loaded";
    case Policy::kPrefixAware:
      return "prefix_aware";
  }
  return "unknown";
}

bool Compatible(const WorkerInfo& a, const WorkerInfo& b) {
  return a.block_size() == b.block_size() &&
         google::protobuf::util::MessageDifferencer::Equals(a.fingerprint(), b.fingerprint());
}

std::vector<uint64_t> PrefixBlockHashes(absl::Span<const int32_t> prompt, int block_size,
                                        int max_blocks) {
  std::vector<uint64_t> hashes;
  if (block_size <= 0) return hashes;
  uint64_t h = 14695981039346656037ull;
  for (int b = 0; b < max_blocks; ++b) {
    const size_t end = static_cast<size_t>(b + 1) * static_cast<size_t>(block_size);
    if (end > prompt.size()) break;
    h = HashTokens(h, prompt.subspan(end - block_size, block_size));
    hashes.push_back(h);
  }
  return hashes;
}

WorkerRegistry::WorkerRegistry(const ServedModel& model, const RegistryOptions& options)
    : model_(model), options_(options) {}

absl::Status WorkerRegistry::Register(const WorkerInfo& info, const estuary::v1::WorkerLoad& load,
                                      absl::Time now, const std::string& identity) {
  if (info.worker_id().empty()) return absl::InvalidArgumentError("worker_id is empty");
  if (info.role() != estuary::v1::WORKER_ROLE_PREFILL &&
      info.role() != estuary::v1::WORKER_ROLE_DECODE) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", info.worker_id(), "': role must be PREFILL or DECODE"));
  }
  if (info.address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", info.worker_id(), "': address is empty"));
  }
  if (info.block_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", info.worker_id(), "': block_size = ", info.block_size(), " must be > 0"));
  }
  if (info.tp_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", info.worker_id(), "': tp_size = ", info.tp_size(), " must be >= 1"));
  }
  if (!model_.model_id.empty() && info.model_id() != model_.model_id) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", info.worker_id(), "' serves model '",
                                                      info.model_id(), "'; this router serves '",
                                                      model_.model_id, "'"));
  }
  // A worker with a longer context serves a router capped shorter (--max-model-len); one with a
  // shorter context could not finish what the router admits.
  if (info.context_length() != 0 && model_.context_length != 0 &&
      info.context_length() < model_.context_length) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker context_length = ", info.context_length(), " is below the router's (",
        model_.context_length, "): start the router with --max-model-len ",
        info.context_length(), " or the worker without a smaller one"));
  }
  if (absl::Status s = CheckFigure("vocab_size", info.vocab_size(), model_.vocab_size); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFigure("num_layers", info.num_layers(), model_.num_layers); !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  // A live worker keeps its id: a registration from elsewhere (another address, role or
  // certificate identity) cannot take it over and redirect its prompts. It may come back once
  // dropped or unregistered.
  if (auto live = workers_.find(info.worker_id()); live != workers_.end()) {
    const WorkerInfo& known = live->second->info;
    if (known.address() != info.address() || known.role() != info.role() ||
        live->second->identity != identity) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker id '", info.worker_id(), "' is registered and live as a ",
          RoleName(known.role()), " worker at ", known.address(), "; a registration from ",
          info.address(),
          live->second->identity != identity ? " under another certificate identity" : "",
          " cannot take it over (unregister it, or wait for it to miss its heartbeats)"));
    }
  }
  auto [it, inserted] = workers_.try_emplace(info.worker_id());
  if (inserted) {
    it->second = std::make_unique<Entry>();
    it->second->order = next_order_++;
    ESTUARY_LOG(INFO) << "registered " << RoleName(info.role()) << " worker " << info.worker_id()
                      << " at " << info.address() << " (tp " << info.tp_size() << ", block "
                      << info.block_size() << ")";
  }
  Entry& entry = *it->second;
  entry.info = info;
  entry.identity = identity;
  entry.load = load;
  entry.last_seen = now;
  return absl::OkStatus();
}

bool WorkerRegistry::Heartbeat(const std::string& worker_id, const estuary::v1::WorkerLoad& load,
                               absl::Time now, const std::string& identity) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second->identity != identity) return false;
  it->second->load = load;
  it->second->last_seen = now;
  return true;
}

bool WorkerRegistry::MarkDead(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return false;
  ESTUARY_LOG(WARNING) << RoleName(it->second->info.role()) << " worker " << worker_id << " at "
                       << it->second->info.address() << " is unreachable; dropped";
  RecordDropLocked(*it->second, "unreachable");
  workers_.erase(it);
  return true;
}

absl::Status WorkerRegistry::Unregister(const std::string& worker_id, const std::string& identity) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second->identity != identity) {
    return absl::NotFoundError(absl::StrCat("no registered worker '", worker_id, "'"));
  }
  ESTUARY_LOG(INFO) << RoleName(it->second->info.role()) << " worker " << worker_id << " at "
                    << it->second->info.address() << " unregistered (draining)";
  RecordDropLocked(*it->second, "unregistered");
  workers_.erase(it);
  return absl::OkStatus();
}

void WorkerRegistry::ExpireLocked(absl::Time now) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (now - it->second->last_seen > options_.worker_timeout) {
      ESTUARY_LOG(WARNING) << RoleName(it->second->info.role()) << " worker " << it->first
                           << " missed its heartbeats for "
                           << absl::FormatDuration(now - it->second->last_seen) << "; dropped";
      RecordDropLocked(*it->second, "expired");
      workers_.erase(it++);
    } else {
      ++it;
    }
  }
}

void WorkerRegistry::RecordDropLocked(const Entry& entry, const char* reason) {
  CountDrop(reason);
  if (dropped_.size() >= kMaxDroppedKept) dropped_.pop_front();
  dropped_.push_back(DroppedWorker{entry.info.worker_id(), entry.info.role(), reason});
}

std::vector<DroppedWorker> WorkerRegistry::TakeDropped() {
  absl::MutexLock lock(&mu_);
  std::vector<DroppedWorker> taken(dropped_.begin(), dropped_.end());
  dropped_.clear();
  return taken;
}

void WorkerRegistry::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
}

std::vector<WorkerRegistry::Entry*> WorkerRegistry::LiveLocked(WorkerRole role) {
  std::vector<Entry*> live;
  for (auto& [id, entry] : workers_) {
    // A worker that says it is not ready (loading, stalled, draining) takes nothing new.
    if (entry->info.role() == role && !entry->load.not_ready()) live.push_back(entry.get());
  }
  std::sort(live.begin(), live.end(),
            [](const Entry* a, const Entry* b) { return a->order < b->order; });
  return live;
}

WorkerView WorkerRegistry::View(const Entry& entry) {
  return WorkerView{entry.info, entry.load, entry.in_flight, entry.in_flight_tokens};
}

std::vector<WorkerView> WorkerRegistry::Live(WorkerRole role, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  std::vector<WorkerView> views;
  for (const Entry* entry : LiveLocked(role)) views.push_back(View(*entry));
  return views;
}

namespace {

// Requests' worth of load: what least_loaded and the affinity imbalance compare.
int64_t RequestLoad(const WorkerInfo& info, const estuary::v1::WorkerLoad& load, int in_flight) {
  if (info.role() == estuary::v1::WORKER_ROLE_DECODE) {
    return std::max<int64_t>(
        load.running_sequences() + load.waiting_sequences() + load.reserved_requests(), in_flight);
  }
  return in_flight;
}

}  // namespace

WorkerRegistry::Entry* WorkerRegistry::PickLocked(const std::vector<Entry*>& candidates,
                                                  absl::Span<const int32_t> prompt,
                                                  int64_t* cursor, AffinityTable& affinity) {
  if (options_.policy == Policy::kRoundRobin) {
    Entry* chosen = candidates[static_cast<size_t>(*cursor % static_cast<int64_t>(candidates.size()))];
    ++*cursor;
    return chosen;
  }
  // Least loaded: (load, -free page share, order), lowest first.
  auto key = [](const Entry* e) {
    int64_t load;
    if (e->info.role() == estuary::v1::WORKER_ROLE_DECODE) {
      load = RequestLoad(e->info, e->load, e->in_flight);
    } else {
      load = std::max<int64_t>(e->load.queued_prefill_tokens(), e->in_flight_tokens);
    }
    const double free_share = e->load.total_pages() > 0
                                  ? static_cast<double>(e->load.free_pages()) / e->load.total_pages()
                                  : 1.0;
    return std::make_tuple(load, e->in_flight, -free_share, e->order);
  };
  Entry* least = *std::min_element(candidates.begin(), candidates.end(),
                                   [&](const Entry* a, const Entry* b) { return key(a) < key(b); });
  if (options_.policy == Policy::kLeastLoaded) return least;

  const std::vector<uint64_t> hashes =
      PrefixBlockHashes(prompt, candidates.front()->info.block_size(), kAffinityBlocks);
  if (hashes.empty()) return least;
  Entry* chosen = least;
  const int64_t least_load = RequestLoad(least->info, least->load, least->in_flight);
  for (auto h = hashes.rbegin(); h != hashes.rend(); ++h) {
    auto it = affinity.find(*h);
    if (it == affinity.end()) continue;
    auto match = std::find_if(candidates.begin(), candidates.end(),
                              [&](const Entry* e) { return e->info.worker_id() == it->second; });
    if (match == candidates.end()) continue;  // gone, or not compatible with this request
    if (RequestLoad((*match)->info, (*match)->load, (*match)->in_flight) <=
        least_load + kAffinityMaxImbalance) {
      chosen = *match;
    }
    break;
  }
  if (affinity.size() + hashes.size() > kAffinityTableMax) affinity.clear();
  for (uint64_t h : hashes) affinity[h] = chosen->info.worker_id();
  return chosen;
}

absl::StatusOr<Placement> WorkerRegistry::ChooseDecode(const std::string& worker_id,
                                                       absl::Span<const int32_t> prompt,
                                                       absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  for (Entry* decode : LiveLocked(estuary::v1::WORKER_ROLE_DECODE)) {
    if (decode->info.worker_id() != worker_id) continue;
    Placement placement;
    placement.decode = CountInFlightLocked(*decode, static_cast<int64_t>(prompt.size()));
    return placement;
  }
  return absl::NotFoundError(absl::StrCat("decode worker '", worker_id, "' is not live"));
}

std::vector<WorkerRegistry::Entry*> WorkerRegistry::Avoiding(std::vector<Entry*> workers,
                                                             absl::Span<const std::string> avoid) {
  std::vector<Entry*> kept;
  for (Entry* w : workers) {
    if (std::find(avoid.begin(), avoid.end(), w->info.worker_id()) == avoid.end()) {
      kept.push_back(w);
    }
  }
  return kept.empty() ? workers : kept;
}

absl::StatusOr<Placement> WorkerRegistry::Choose(absl::Span<const int32_t> prompt, bool local,
                                                 absl::Time now,
                                                 absl::Span<const std::string> avoid) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  const std::vector<Entry*> decodes =
      Avoiding(LiveLocked(estuary::v1::WORKER_ROLE_DECODE), avoid);
  if (decodes.empty()) return absl::UnavailableError("no decode worker is registered");
  const int64_t tokens = static_cast<int64_t>(prompt.size());
  Placement placement;
  if (local) {
    placement.decode =
        CountInFlightLocked(*PickLocked(decodes, prompt, &decode_cursor_, decode_affinity_), tokens);
    return placement;
  }
  const std::vector<Entry*> prefills =
      Avoiding(LiveLocked(estuary::v1::WORKER_ROLE_PREFILL), avoid);
  if (prefills.empty()) return absl::UnavailableError("no prefill worker is registered");
  std::vector<Entry*> paired;  // decode workers with at least one compatible prefill worker
  for (Entry* d : decodes) {
    if (std::any_of(prefills.begin(), prefills.end(),
                    [&](const Entry* p) { return Compatible(d->info, p->info); })) {
      paired.push_back(d);
    }
  }
  if (paired.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "no registered prefill worker matches the KV format (fingerprint and block size) of a "
        "registered decode worker (", decodes.size(), " decode, ", prefills.size(), " prefill)"));
  }
  Entry* decode = PickLocked(paired, prompt, &decode_cursor_, decode_affinity_);
  std::vector<Entry*> matching;
  for (Entry* p : prefills) {
    if (Compatible(decode->info, p->info)) matching.push_back(p);
  }
  Entry* prefill = PickLocked(matching, prompt, &prefill_cursor_, prefill_affinity_);
  placement.decode = CountInFlightLocked(*decode, tokens);
  placement.prefill = CountInFlightLocked(*prefill, tokens);
  return placement;
}

WorkerView WorkerRegistry::CountInFlightLocked(Entry& entry, int64_t tokens) {
  ++entry.in_flight;
  entry.in_flight_tokens += tokens;
  return View(entry);
}

bool WorkerRegistry::HasCompatiblePair(absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  const std::vector<Entry*> decodes = LiveLocked(estuary::v1::WORKER_ROLE_DECODE);
  const std::vector<Entry*> prefills = LiveLocked(estuary::v1::WORKER_ROLE_PREFILL);
  for (const Entry* d : decodes) {
    for (const Entry* p : prefills) {
      if (Compatible(d->info, p->info)) return true;
    }
  }
  return false;
}

void WorkerRegistry::Release(const std::string& worker_id, int64_t prompt_tokens) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  it->second->in_flight = std::max(0, it->second->in_flight - 1);
  it->second->in_flight_tokens = std::max<int64_t>(0, it->second->in_flight_tokens - prompt_tokens);
}

}  // namespace estuary::router
