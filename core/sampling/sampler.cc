#include "core/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace estuary {
namespace {
absl::Status OutOfRange(const char* field, double value, const char* limit) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling: ", field, " = ", value, " must be ", limit));
}
}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f && temperature <= 100.0f)) {
    return OutOfRange("temperature", temperature, "in [0, 100]");
  }
  if (top_k < 0) return OutOfRange("top_k", top_k, ">= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return OutOfRange("top_p", top_p, "in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return OutOfRange("min_p", min_p, "in [0, 1]");
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 10.0f)) {
    return OutOfRange("repetition_penalty", repetition_penalty, "in (0, 10]");
  }
  return absl::OkStatus();
}

int32_t Argmax(absl::Span<const float> values) {
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(SamplingParams params) : params_(std::move(params)), rng_(params_.seed) {}

bool Sampler::IsStopToken(int32_t id) const {
  return std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), id) !=
         params_.stop_token_ids.end();
}

int32_t Sampler::Sample(absl::Span<float> logits, absl::Span<const int32_t> history) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params_.repetition_penalty != 1.0f) {
    absl::flat_hash_set<int32_t> seen(history.begin(), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= vocab) continue;
      float& l = logits[static_cast<size_t>(id)];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if (params_.temperature == 0.0f) return Argmax(logits);

  // Candidates sorted by logit, descending; filters cut the tail.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  size_t keep = order.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep), order.end(),
                      by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  order.resize(keep);

  std::vector<double> probs(keep);
  const double max_logit = logits[static_cast<size_t>(order[0])];
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[static_cast<size_t>(order[i])] - max_logit) / params_.temperature);
    total += probs[i];
  }
  for (double& p : probs) p /= total;

  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * probs[0];
    size_t n = 1;
    while (n < keep && probs[n] >= threshold) ++n;
    keep = n;
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t n = 0;
    while (n < keep) {
      cumulative += probs[n++];
      if (cumulative >= params_.top_p) break;
    }
    keep = n;
  }
  double kept_total = 0.0;
  for (size_t i = 0; i < keep; ++i) kept_total += probs[i];
  const double r = std::uniform_real_distribution<double>(0.0, kept_total)(rng_);
  double cumulative = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += probs[i];
    if (r < cumulative) return order[i];
  }
  return order[keep - 1];
}

}  // namespace estuary
