#include "cli/bench_result.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace estuary::cli {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (rank - static_cast<double>(below)) * (values[above] - values[below]);
}

namespace {

// mean_, median_, std_ and p99_ of `seconds`, in milliseconds, under `name` (e.g. "ttft").
void AddStats(const std::string& name, const std::vector<double>& seconds, nlohmann::json& out) {
  double mean = 0, variance = 0;
  if (!seconds.empty()) {
    mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / seconds.size();
    for (double v : seconds) variance += (v - mean) * (v - mean);
    variance /= seconds.size();
  }
  out["mean_" + name + "_ms"] = 1e3 * mean;
  out["median_" + name + "_ms"] = 1e3 * Percentile(seconds, 50);
  out["std_" + name + "_ms"] = 1e3 * std::sqrt(variance);
  out["p99_" + name + "_ms"] = 1e3 * Percentile(seconds, 99);
}

}  // namespace

nlohmann::json SummarizeBench(const std::vector<RequestTiming>& timings, double duration_seconds) {
  std::vector<double> ttft, tpot, itl, e2el;
  int completed = 0, failed = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  for (const RequestTiming& t : timings) {
    if (!t.ok) {
      ++failed;
      continue;
    }
    ++completed;
    input_tokens += t.prompt_tokens;
    output_tokens += t.output_tokens;
    ttft.push_back(t.ttft);
    e2el.push_back(t.e2e);
    if (t.output_tokens > 1) tpot.push_back((t.e2e - t.ttft) / (t.output_tokens - 1));
    itl.insert(itl.end(), t.itl.begin(), t.itl.end());
  }
  const double duration = duration_seconds > 0 ? duration_seconds : 1e-9;
  nlohmann::json out = {
      {"duration", duration_seconds},
      {"completed", completed},
      {"failed", failed},
      {"total_input_tokens", input_tokens},
      {"total_output_tokens", output_tokens},
      {"request_throughput", completed / duration},
      {"output_throughput", static_cast<double>(output_tokens) / duration},
      {"total_token_throughput", static_cast<double>(input_tokens + output_tokens) / duration},
  };
  AddStats("ttft", ttft, out);
  AddStats("tpot", tpot, out);
  AddStats("itl", itl, out);
  AddStats("e2el", e2el, out);
  return out;
}

}  // namespace estuary::cli
