#include "decode/exit_stats.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace estuary {

void ExitStats::RecordDecodeToken(int backbone_layers) {
  const int n = n_layers();
  if (backbone_layers < 0 || backbone_layers > n) return;
  ++histogram_[static_cast<size_t>(backbone_layers)];
  ++decode_tokens_;
  exited_tokens_ += backbone_layers < n;
  backbone_layer_sum_ += backbone_layers;
  kv_slots_total_ += n;
  kv_slots_river_ += n - backbone_layers;
}

void ExitStats::RecordPrefillTokens(int64_t tokens) { kv_slots_total_ += tokens * n_layers(); }

double ExitStats::mean_backbone_layers() const {
  return decode_tokens_ ? static_cast<double>(backbone_layer_sum_) / decode_tokens_ : 0.0;
}

double ExitStats::exit_rate() const {
  return decode_tokens_ ? static_cast<double>(exited_tokens_) / decode_tokens_ : 0.0;
}

double ExitStats::river_kv_share() const {
  return kv_slots_total_ ? static_cast<double>(kv_slots_river_) / kv_slots_total_ : 0.0;
}

std::string ExitStats::ToString() const {
  return absl::StrCat("decode tokens ", decode_tokens_, ", mean backbone layers ",
                      mean_backbone_layers(), " of ", n_layers(), ", exit rate ", exit_rate(),
                      ", river KV share ", river_kv_share(), ", histogram [",
                      absl::StrJoin(histogram_, " "), "]");
}

}  // namespace estuary
