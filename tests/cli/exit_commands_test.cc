// `estuary eval-exit`, `estuary bench-decode` and `estuary generate --exit-mode lossless` as a
// user runs them: real binary, JSON output.
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {
namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::RunProcess;

nlohmann::json RunJson(const std::vector<std::string>& argv) {
  auto result = RunProcess(argv);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return {};
  EXPECT_EQ(result->exit_code, 0) << result->err;
  nlohmann::json out = nlohmann::json::parse(result->out, nullptr, false);
  EXPECT_TRUE(out.is_object()) << result->out << result->err;
  return out;
}

TEST(EvalExitCommandTest, RowsPerThresholdAndFullInt4) {
  const fs::path prompts = fs::temp_directory_path() / "estuary-eval-prompts.txt";
  std::ofstream(prompts) << "Once upon a time\nThe little dog was sad because\n";
  const nlohmann::json out =
      RunJson({BinaryPath("cli/estuary"), "eval-exit", "--model", "models/stories12L",
               "--taus", "2,0.8", "--prompts", prompts.string(), "--max-tokens", "24", "--json"});
  fs::remove(prompts);
  ASSERT_TRUE(out.contains("rows"));
  const auto& rows = out["rows"];
  ASSERT_EQ(rows.size(), 3u);
  for (const char* field : {"tau", "mean_backbone_layers", "exit_rate", "top1_agreement",
                            "nll_delta", "kv_cosine_min", "modeled_bytes_ratio",
                            "measured_speedup"}) {
    for (const auto& row : rows) EXPECT_TRUE(row.contains(field)) << field;
  }
  // τ = 2 never exits: full depth, identical predictions, no NLL change, full bytes.
  EXPECT_DOUBLE_EQ(rows[0]["mean_backbone_layers"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(rows[0]["top1_agreement"].get<double>(), 1.0);
  EXPECT_NEAR(rows[0]["nll_delta"].get<double>(), 0.0, 1e-9);
  EXPECT_DOUBLE_EQ(rows[0]["modeled_bytes_ratio"].get<double>(), 1.0);
  // τ = 0.8 exits early and reads fewer bytes; full int4 runs no backbone layer.
  EXPECT_LT(rows[1]["mean_backbone_layers"].get<double>(), 12.0);
  EXPECT_LT(rows[1]["modeled_bytes_ratio"].get<double>(), 1.0);
  EXPECT_EQ(rows[2]["tau"], "full-int4");
  EXPECT_DOUBLE_EQ(rows[2]["mean_backbone_layers"].get<double>(), 0.0);
  EXPECT_GT(rows[2]["kv_cosine_min"].get<double>(), 0.9);
}

// --exit-mode lossless adds a lossless row per τ and one with the default drafts (wholly on the
// river): the full model's continuation exactly, with the drafts' acceptance and what a token
// costs.
TEST(EvalExitCommandTest, LosslessRowsReproduceTheFullModel) {
  const fs::path prompts = fs::temp_directory_path() / "estuary-eval-lossless-prompts.txt";
  std::ofstream(prompts) << "Once upon a time\nThe little dog was sad because\n";
  const nlohmann::json out = RunJson(
      {BinaryPath("cli/estuary"), "eval-exit", "--model", "models/stories12L", "--taus", "0.8",
       "--prompts", prompts.string(), "--max-tokens", "32", "--exit-mode", "lossless",
       "--draft-tokens", "6", "--json"});
  fs::remove(prompts);
  ASSERT_TRUE(out.contains("rows"));
  const auto& rows = out["rows"];
  ASSERT_EQ(rows.size(), 4u);  // τ 0.8, full int4, lossless τ 0.8 and full int4 (the default)
  const auto& lossless = rows[2];
  EXPECT_EQ(lossless["mode"], "lossless");
  EXPECT_NEAR(lossless["tau"].get<double>(), 0.8, 1e-6);
  EXPECT_DOUBLE_EQ(lossless["exact_match"].get<double>(), 1.0);
  const double acceptance = lossless["acceptance"].get<double>();
  EXPECT_GT(acceptance, 0.5);
  EXPECT_LE(acceptance, 1.0);
  // More than one token per verification, fewer weight bytes per token than full depth.
  EXPECT_GT(lossless["tokens_per_verification"].get<double>(), 1.5);
  EXPECT_LT(lossless["cost_per_token"].get<double>(), 1.0);
  EXPECT_GT(lossless["cost_per_token"].get<double>(), 0.0);
  EXPECT_GT(lossless["measured_speedup"].get<double>(), 0.0);
  EXPECT_LT(lossless["mean_draft_backbone_layers"].get<double>(), 12.0);
  // The default drafts, wholly on the river: no backbone layer, the same exact continuation.
  const auto& river = rows[3];
  EXPECT_EQ(river["mode"], "lossless");
  EXPECT_EQ(river["tau"], "full-int4");
  EXPECT_DOUBLE_EQ(river["mean_draft_backbone_layers"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(river["exact_match"].get<double>(), 1.0);
  EXPECT_GT(river["acceptance"].get<double>(), 0.5);
  EXPECT_LT(river["cost_per_token"].get<double>(), lossless["cost_per_token"].get<double>());
}

TEST(BenchDecodeCommandTest, ModesAndBatchesOnATinySynthModel) {
  const fs::path dir = fs::temp_directory_path() / "estuary-bench-tiny";
  auto synth = RunProcess({BinaryPath("cli/estuary"), "synth", "--preset", "tiny", "--out",
                           dir.string()});
  ASSERT_TRUE(synth.ok() && synth->exit_code == 0);
  const nlohmann::json out =
      RunJson({BinaryPath("cli/estuary"), "bench-decode", "--model", dir.string(), "--batch",
               "1,3", "--exit-after", "1", "--steps", "2", "--json"});
  fs::remove_all(dir);
  ASSERT_TRUE(out.contains("rows"));
  ASSERT_EQ(out["rows"].size(), 6u);
  EXPECT_GT(out["stream_read_gbytes_per_second"].get<double>(), 0.0);
  for (const auto& row : out["rows"]) {
    EXPECT_GT(row["tokens_per_second"].get<double>(), 0.0);
    EXPECT_GT(row["bytes_per_token"].get<double>(), 0.0);
    EXPECT_TRUE(row["mode"] == "full" || row["mode"] == "river" || row["mode"] == "int4");
  }
  // Fewer bytes per token on the river than at full depth, fewest on full int4.
  EXPECT_LT(out["rows"][1]["bytes_per_token"].get<double>(),
            out["rows"][0]["bytes_per_token"].get<double>());
  EXPECT_LT(out["rows"][2]["bytes_per_token"].get<double>(),
            out["rows"][1]["bytes_per_token"].get<double>());
}

TEST(BenchDecodeCommandTest, TheLosslessModeAddsItsRowsAndSpeedupModel) {
  const fs::path dir = fs::temp_directory_path() / "estuary-bench-tiny-lossless";
  auto synth = RunProcess({BinaryPath("cli/estuary"), "synth", "--preset", "tiny", "--out",
                           dir.string()});
  ASSERT_TRUE(synth.ok() && synth->exit_code == 0);
  const nlohmann::json out = RunJson(
      {BinaryPath("cli/estuary"), "bench-decode", "--model", dir.string(), "--batch", "1,3",
       "--exit-after", "1", "--steps", "2", "--exit-mode", "lossless", "--draft-tokens", "3",
       "--min-draft-confidence", "0", "--json"});
  fs::remove_all(dir);
  ASSERT_TRUE(out.contains("rows"));
  ASSERT_EQ(out["rows"].size(), 12u);  // per batch: full, river, int4, verify, full-gen, lossless
  for (int batch : {1, 3}) {
    int found = 0;
    for (const auto& row : out["rows"]) {
      if (row["batch"] != batch) continue;
      EXPECT_GT(row["tokens_per_second"].get<double>(), 0.0) << row.dump();
      if (row["mode"] == "lossless") {
        ++found;
        EXPECT_GE(row["acceptance"].get<double>(), 0.0);
        EXPECT_LE(row["acceptance"].get<double>(), 1.0);
        // A round emits between 1 and k + 1 tokens.
        EXPECT_GE(row["tokens_per_verification"].get<double>(), 1.0);
        EXPECT_LE(row["tokens_per_verification"].get<double>(), 4.0);
      }
      if (row["mode"] == "verify" || row["mode"] == "full-gen") ++found;
    }
    EXPECT_EQ(found, 3) << "batch " << batch;
  }
  ASSERT_EQ(out["lossless_models"].size(), 2u);
  const auto& model = out["lossless_models"][0];
  EXPECT_EQ(model["draft_tokens"], 3);
  EXPECT_GT(model["river_cost"].get<double>(), 0.0);
  EXPECT_GT(model["verify_cost"].get<double>(), 0.0);
  // The model's speedup grows with the acceptance.
  EXPECT_LT(model["predicted_speedup"]["0.70"].get<double>(),
            model["predicted_speedup"]["1.00"].get<double>());
  bool has_target = false;
  for (const auto& t : out["targets"]) has_target |= t["name"].get<std::string>().find("lossless") == 0;
  EXPECT_TRUE(has_target);
}

TEST(BenchDecodeCommandTest, BadFlagsAreRejected) {
  auto result = RunProcess({BinaryPath("cli/estuary"), "bench-decode"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_NE(result->err.find("--model"), std::string::npos) << result->err;
  result = RunProcess({BinaryPath("cli/estuary"), "eval-exit", "--model",
                       "models/stories12L", "--prompts",
                       "models/stories12L/prompts.txt", "--taus", "0.8,abc"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_NE(result->err.find("abc"), std::string::npos) << result->err;
  // The lossless-only flags need the lossless mode; the mode must be one of the two.
  result = RunProcess({BinaryPath("cli/estuary"), "bench-decode", "--model", "models/stories260K",
                       "--draft-tokens", "3"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_NE(result->err.find("--draft-tokens applies to --exit-mode lossless"), std::string::npos)
      << result->err;
  result = RunProcess({BinaryPath("cli/estuary"), "eval-exit", "--model", "models/stories12L",
                       "--prompts", "models/stories12L/prompts.txt", "--taus", "0.8",
                       "--exit-mode", "bogus"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_NE(result->err.find("use lossy or lossless"), std::string::npos) << result->err;
}

// generate's lossless mode: full depth's ids with the counters in the JSON, whatever the drafts'
// depth (--draft-backbone-layers; --exit-threshold is refused where it moves no draft).
TEST(GenerateLosslessCommandTest, FullDepthIdsAtEveryDraftDepthAndItsFlagsChecked) {
  const std::vector<std::string> base = {BinaryPath("cli/estuary"), "generate",  "--model",
                                         "models/stories12L",      "--prompt", "Once upon a time",
                                         "--max-tokens",           "48",       "--temperature",
                                         "0",                      "--json",   "--threads",
                                         "1"};
  const nlohmann::json full = RunJson(base);
  ASSERT_TRUE(full.contains("completion_ids"));
  for (const std::vector<std::string>& drafts :
       {std::vector<std::string>{}, std::vector<std::string>{"--draft-backbone-layers", "2"},
        std::vector<std::string>{"--draft-backbone-layers", "-1", "--exit-threshold", "0.8"}}) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), {"--river", "--exit-mode", "lossless"});
    argv.insert(argv.end(), drafts.begin(), drafts.end());
    const nlohmann::json out = RunJson(argv);
    EXPECT_EQ(out["completion_ids"], full["completion_ids"]) << drafts.size();
    EXPECT_EQ(out["exit_mode"], "lossless");
    EXPECT_GT(out["draft_tokens"].get<int64_t>(), 0) << drafts.size();
    EXPECT_LE(out["accepted_tokens"].get<int64_t>(), out["draft_tokens"].get<int64_t>());
  }
  // Plain rounds only: no drafts, one full-depth token a round (the first from the prefill).
  std::vector<std::string> argv = base;
  argv.insert(argv.end(), {"--river", "--exit-mode", "lossless", "--drafting", "never"});
  const nlohmann::json plain = RunJson(argv);
  EXPECT_EQ(plain["completion_ids"], full["completion_ids"]);
  EXPECT_EQ(plain["draft_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(plain["plain_rounds"].get<int64_t>() + 1,
            static_cast<int64_t>(full["completion_ids"].size()));
  struct Refused {
    std::vector<std::string> flags;
    std::string error;
  };
  for (const Refused& bad :
       {Refused{{"--river", "--exit-mode", "lossless", "--exit-threshold", "0.8"},
                "--exit-threshold moves no draft"},
        Refused{{"--river", "--draft-backbone-layers", "2"},
                "--draft-backbone-layers applies to --exit-mode lossless"},
        Refused{{"--river", "--exit-mode", "lossless", "--draft-backbone-layers", "13"},
                "--draft-backbone-layers = 13 must be -1 (no cap) or in [0, 12]"},
        Refused{{"--river", "--drafting", "always"}, "--drafting applies to --exit-mode lossless"},
        Refused{{"--river", "--exit-mode", "lossless", "--drafting", "sometimes"},
                "--drafting=sometimes: use auto, always or never"}}) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), bad.flags.begin(), bad.flags.end());
    auto result = RunProcess(argv);
    ASSERT_TRUE(result.ok());
    EXPECT_NE(result->exit_code, 0) << bad.error;
    EXPECT_NE(result->err.find(bad.error), std::string::npos) << result->err;
  }
}

}  // namespace
}  // namespace estuary
