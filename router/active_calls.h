#pragma once
// ActiveCalls: the Generate calls in flight, by client-visible request id, so that an Abort by
// id, the watchdog (stage timeouts, dropped workers) and the drain reach them. Thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace estuary::router {

class GenerateCall;

class ActiveCalls {
 public:
  // False when `id` is in flight already.
  bool Add(const std::string& id, std::shared_ptr<GenerateCall> call);
  void Remove(const std::string& id);
  std::shared_ptr<GenerateCall> Find(const std::string& id);
  std::vector<std::shared_ptr<GenerateCall>> All();
  int size();

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<GenerateCall>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary::router
