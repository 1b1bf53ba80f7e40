#pragma once
// The summary of one bench-serve run, in the keys of `vllm bench serve --save-result` so that
// the same scripts read both: duration, completed, failed, total_input_tokens,
// total_output_tokens, request_throughput, output_throughput, total_token_throughput, and
// mean_/median_/std_/p99_ of ttft_ms, tpot_ms, itl_ms and e2el_ms. As in vLLM: TPOT is per
// request, (e2e - ttft) / (output tokens - 1) for requests of more than one token; ITL pools
// every request's gaps between chunks; percentiles interpolate linearly (numpy's default).

#include <vector>

#include "cli/bench_client.h"
#include "nlohmann/json.hpp"

namespace estuary::cli {

// The metric keys above for `timings` over `duration_seconds` (the run's wall time).
nlohmann::json SummarizeBench(const std::vector<RequestTiming>& timings, double duration_seconds);

// numpy.percentile(values, q) with linear interpolation; 0 for no values. q in [0, 100].
double Percentile(std::vector<double> values, double q);

}  // namespace estuary::cli
