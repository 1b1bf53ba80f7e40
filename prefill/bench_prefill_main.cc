// bench_prefill: a stand-alone driver of RunBenchPrefill (the same as `estuary bench-prefill`).
//   bench_prefill --model /tmp/synth1b [--tp 1,2] [--prompt-tokens 2048] [--json]
// Flag names take '-' or '_'.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "prefill/bench_prefill.h"

ABSL_FLAG(std::string, model, "", "model folder (Hugging Face) or llama2.c model");
ABSL_FLAG(std::string, dtype, "", "convert weights at load: f32 or bf16 (default: keep)");
ABSL_FLAG(std::string, tp, "1,2", "comma-separated tensor-parallel sizes");
ABSL_FLAG(int, prompt_tokens, 2048, "random prompt length");
ABSL_FLAG(int, max_num_batched_tokens, 512, "prefill chunk (tokens per step)");
ABSL_FLAG(int, threads, 0, "CPU threads in all (0: the machine's cores)");
ABSL_FLAG(int, prefill_iterations, 1, "timed prefills per TP size");
ABSL_FLAG(int, matmul_iterations, 2, "timed calls per GEMM shape and kernel");
ABSL_FLAG(bool, skip_matmul, false, "skip the GEMM comparison");
ABSL_FLAG(bool, json, false, "print {\"rows\": [...]}");

int main(int argc, char** argv) {
  // Accept --prompt-tokens as well as --prompt_tokens.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> pointers;
  for (std::string& arg : args) {
    if (arg.rfind("--", 0) == 0) {
      for (size_t i = 2; i < arg.size() && arg[i] != '='; ++i) {
        if (arg[i] == '-') arg[i] = '_';
      }
    }
    pointers.push_back(arg.data());
  }
  absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  estuary::BenchPrefillOptions options;
  options.model_path = absl::GetFlag(FLAGS_model);
  options.dtype = absl::GetFlag(FLAGS_dtype);
  options.tp_sizes.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_tp), ',', absl::SkipEmpty())) {
    int tp = 0;
    if (!absl::SimpleAtoi(part, &tp) || tp < 1) {
      std::fprintf(stderr, "--tp: bad size '%s'\n", std::string(part).c_str());
      return 2;
    }
    options.tp_sizes.push_back(tp);
  }
  options.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  options.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.prefill_iterations = absl::GetFlag(FLAGS_prefill_iterations);
  options.matmul_iterations = absl::GetFlag(FLAGS_matmul_iterations);
  options.skip_matmul = absl::GetFlag(FLAGS_skip_matmul);
  options.json = absl::GetFlag(FLAGS_json);
  const absl::Status status = estuary::RunBenchPrefill(options);
  if (!status.ok()) {
    std::fprintf(stderr, "bench-prefill: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
