#include "cli/exit_commands.h"

#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/progress_bar.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/model_loader.h"
#include "core/model/river.h"

namespace estuary::cli {
namespace {

absl::StatusOr<std::vector<std::string>> ReadPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read prompts file ", path));
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " has no prompts"));
  return prompts;
}

absl::StatusOr<LoadedModel> Load(const std::string& path) {
  LoadOptions load;
  load.progress = MakeProgressReporter();
  return LoadModel(path, load);
}

}  // namespace

absl::Status RunEvalExitCommand(const EvalExitCommandOptions& options) {
  if (options.taus.empty()) return absl::InvalidArgumentError("--taus needs at least one value");
  kernels::cpu::SetCpuThreads(options.threads);
  ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, Load(options.model));
  ESTUARY_RETURN_IF_ERROR(options.river.policy.Validate(loaded.model->config().n_layers));
  EvalExitOptions eval;
  ESTUARY_ASSIGN_OR_RETURN(eval.prompts, ReadPrompts(options.prompts_file));
  eval.taus = options.taus;
  eval.max_tokens = options.max_tokens;
  eval.policy = options.river.policy;
  eval.lossless = options.lossless;
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<River> river,
                           River::Build(loaded.model->weights(), options.river.quant,
                                        /*first_layer=*/0, /*row_parallel_blocks=*/1,
                                        options.river.lm_head));
  ESTUARY_ASSIGN_OR_RETURN(std::vector<EvalExitRow> rows,
                           RunEvalExit(*loaded.model, *loaded.tokenizer, *river, eval));
  std::cout << (options.json ? EvalExitJson(rows) + "\n" : EvalExitTable(rows)) << std::flush;
  return absl::OkStatus();
}

absl::Status RunBenchDecodeCommand(const BenchDecodeCommandOptions& options) {
  kernels::cpu::SetCpuThreads(options.threads);
  ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, Load(options.model));
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<River> river,
                           River::Build(loaded.model->weights(), options.river.quant,
                                        /*first_layer=*/0, /*row_parallel_blocks=*/1,
                                        options.river.lm_head));
  // The read ceiling is measured inside RunBenchDecode, on the threads the decode runs on.
  BenchDecodeOptions bench = options.bench;
  bench.threads = options.threads;
  ESTUARY_ASSIGN_OR_RETURN(BenchDecodeReport report,
                           RunBenchDecode(*loaded.model, *river, bench));
  std::cout << (options.json ? BenchDecodeJson(report) + "\n" : BenchDecodeTable(report))
            << std::flush;
  return absl::OkStatus();
}

}  // namespace estuary::cli
