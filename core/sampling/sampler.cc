#include "core/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
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
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return OutOfRange("presence_penalty", presence_penalty, "in [-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return OutOfRange("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  if (min_tokens < 0) return OutOfRange("min_tokens", min_tokens, ">= 0");
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return OutOfRange("logprobs", logprobs, "in [0, 20] (or unset)");
  }
  if (logit_bias.size() > kMaxLogitBiasEntries) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: logit_bias has ", logit_bias.size(),
                                                   " entries; at most ", kMaxLogitBiasEntries));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return OutOfRange("logit_bias token id", id, ">= 0");
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return OutOfRange("logit_bias value", bias, "in [-100, 100]");
    }
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

TokenLogprobs LogprobsOf(absl::Span<const float> raw_logits, int32_t chosen, int top_n) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (float l : raw_logits) max_logit = std::max(max_logit, static_cast<double>(l));
  double total = 0.0;
  for (float l : raw_logits) total += std::exp(static_cast<double>(l) - max_logit);
  const double log_total = max_logit + std::log(total);
  auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(raw_logits[static_cast<size_t>(id)]) - log_total);
  };
  TokenLogprobs out;
  out.logprob = logprob(chosen);
  const size_t n = std::min(static_cast<size_t>(std::max(top_n, 0)), raw_logits.size());
  std::vector<int32_t> order(raw_logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(n), order.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = raw_logits[static_cast<size_t>(a)];
                      const float lb = raw_logits[static_cast<size_t>(b)];
                      return la > lb || (la == lb && a < b);
                    });
  out.top.reserve(n);
  for (size_t i = 0; i < n; ++i) out.top.push_back({order[i], logprob(order[i])});
  return out;
}

Sampler::Sampler(SamplingParams params, std::vector<int32_t> eos_ids)
    : params_(std::move(params)), eos_ids_(std::move(eos_ids)) {}

bool Sampler::greedy() const {
  return params_.temperature == 0.0f && params_.repetition_penalty == 1.0f &&
         params_.presence_penalty == 0.0f && params_.frequency_penalty == 0.0f &&
         params_.logit_bias.empty() && params_.min_tokens == 0 && params_.logprobs < 0;
}

bool Sampler::IsStopToken(int32_t id) const {
  return std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), id) !=
         params_.stop_token_ids.end();
}

void Sampler::AdjustLogits(absl::Span<float> logits, absl::Span<const int32_t> history,
                           int generated) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) logits[static_cast<size_t>(id)] += bias;
  }
  if (generated < params_.min_tokens) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    for (int32_t id : eos_ids_) {
      if (in_vocab(id)) logits[static_cast<size_t>(id)] = kMasked;
    }
    for (int32_t id : params_.stop_token_ids) {
      if (in_vocab(id)) logits[static_cast<size_t>(id)] = kMasked;
    }
  }
  if (params_.repetition_penalty != 1.0f) {
    absl::flat_hash_set<int32_t> seen(history.begin(), history.end());
    for (int32_t id : seen) {
      if (!in_vocab(id)) continue;
      float& l = logits[static_cast<size_t>(id)];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    const size_t output = std::min(history.size(), static_cast<size_t>(std::max(generated, 0)));
    absl::flat_hash_map<int32_t, int> counts;
    for (int32_t id : history.last(output)) ++counts[id];
    for (const auto& [id, count] : counts) {
      if (!in_vocab(id)) continue;
      logits[static_cast<size_t>(id)] -=
          params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
    }
  }
}

SampledToken Sampler::Sample(absl::Span<float> logits, absl::Span<const int32_t> history,
                             int generated) {
  std::vector<float> raw;
  if (params_.logprobs >= 0) raw.assign(logits.begin(), logits.end());
  AdjustLogits(logits, history, generated);
  SampledToken out;
  out.id = params_.temperature == 0.0f ? Argmax(logits) : Draw(logits, generated);
  if (params_.logprobs >= 0) out.logprobs = LogprobsOf(raw, out.id, params_.logprobs);
  return out;
}

namespace {

// The engine of output position `generated`, stream `stream`: SplitMix64 of (seed, position,
// stream), distinct and well-mixed seeds for neighbouring positions and streams.
std::mt19937_64 RngFor(uint64_t seed, int generated, uint32_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(generated) + 1) +
               0xD1B54A32D192ED03ull * stream;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return std::mt19937_64(z ^ (z >> 31));
}

}  // namespace

Sampler::Candidates Sampler::Filter(absl::Span<const float> logits) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  Candidates c;
  // Candidates sorted by logit, descending; filters cut the tail.
  std::vector<int32_t>& order = c.order;
  order.resize(static_cast<size_t>(vocab));
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

  std::vector<double>& probs = c.probs;
  probs.resize(keep);
  const double max_logit = logits[static_cast<size_t>(order[0])];
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[static_cast<size_t>(order[i])] - max_logit) / params_.temperature);
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  // Masked tokens (min_tokens) have probability 0: never the fallback pick below.
  while (keep > 1 && probs[keep - 1] == 0.0) --keep;

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
  c.keep = keep;
  return c;
}

int32_t Sampler::Draw(absl::Span<const float> logits, int generated) const {
  const Candidates c = Filter(logits);
  std::mt19937_64 rng = RngFor(params_.seed, generated, 0);
  double kept_total = 0.0;
  for (size_t i = 0; i < c.keep; ++i) kept_total += c.probs[i];
  const double r = std::uniform_real_distribution<double>(0.0, kept_total)(rng);
  double cumulative = 0.0;
  for (size_t i = 0; i < c.keep; ++i) {
    cumulative += c.probs[i];
    if (r < cumulative) return c.order[i];
  }
  return c.order[c.keep - 1];
}

std::vector<double> Sampler::Distribution(absl::Span<float> logits,
                                          absl::Span<const int32_t> history,
                                          int generated) const {
  AdjustLogits(logits, history, generated);
  std::vector<double> out(logits.size(), 0.0);
  if (params_.temperature == 0.0f) {
    out[static_cast<size_t>(Argmax(logits))] = 1.0;
    return out;
  }
  const Candidates c = Filter(logits);
  double kept_total = 0.0;
  for (size_t i = 0; i < c.keep; ++i) kept_total += c.probs[i];
  for (size_t i = 0; i < c.keep; ++i) {
    out[static_cast<size_t>(c.order[i])] = c.probs[i] / kept_total;
  }
  return out;
}

double Sampler::Uniform(int generated, uint32_t stream) const {
  std::mt19937_64 rng = RngFor(params_.seed, generated, stream);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

int32_t DrawFrom(absl::Span<const double> probs, double u) {
  double total = 0.0;
  for (double p : probs) total += p;
  const double r = u * total;
  double cumulative = 0.0;
  int32_t last_with_mass = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0) continue;
    cumulative += probs[i];
    last_with_mass = static_cast<int32_t>(i);
    if (r < cumulative) return last_with_mass;
  }
  return last_with_mass;
}

}  // namespace estuary
