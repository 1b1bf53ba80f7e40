#pragma once
// ExitStats: counters of the exit river on a decode worker (design §9): backbone layers per
// generated token (histogram), exit rate, and the river's share of KV slots written.
// Owned by the engine; updated on its thread; copied out for reporting.

#include <cstdint>
#include <string>
#include <vector>

namespace estuary {

class ExitStats {
 public:
  explicit ExitStats(int n_layers = 0) : histogram_(static_cast<size_t>(n_layers) + 1, 0) {}

  // One generated token that ran `backbone_layers` of `n_layers` on the backbone.
  void RecordDecodeToken(int backbone_layers);
  // Prefill tokens: every layer on the backbone.
  void RecordPrefillTokens(int64_t tokens);

  int n_layers() const { return static_cast<int>(histogram_.size()) - 1; }
  const std::vector<int64_t>& histogram() const { return histogram_; }  // [backbone layers]
  int64_t decode_tokens() const { return decode_tokens_; }
  double mean_backbone_layers() const;
  double exit_rate() const;          // share of decode tokens that left before the last layer
  double river_kv_share() const;     // river-written (layer, slot) pairs / all written
  std::string ToString() const;

 private:
  std::vector<int64_t> histogram_;
  int64_t decode_tokens_ = 0;
  int64_t exited_tokens_ = 0;
  int64_t backbone_layer_sum_ = 0;
  int64_t kv_slots_total_ = 0;
  int64_t kv_slots_river_ = 0;
};

}  // namespace estuary
