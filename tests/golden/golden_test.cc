// Golden greedy outputs of the shipped tiny models, through the real `estuary` binary:
//   1. llama2.c folders: prompt_ids and completion_ids equal golden.json's, exactly;
//   2. after `estuary convert --dtype f32`, the Hugging Face loader gives the same ids;
//   3. after `estuary convert --dtype bf16`, the share of identical tokens is printed (bf16
//      rounding legitimately changes some argmaxes) and must stay above a sanity floor;
//   4. after `estuary widen --preset small --dtype f32` (stories12L in 4x its dim and head
//      dim, zero-padded: the same function up to summation order), the golden ids again.

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {
namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::RunProcess;

using ::estuary::testing::AllGoldenCases;
using ::estuary::testing::GoldenCase;

std::string ModelDir(const std::string& model) { return ::estuary::testing::GoldenModelDir(model); }

struct Generated {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> completion_ids;
};

// Runs `estuary generate` greedily with 200 new tokens and parses its JSON (also into `json`).
Generated RunGenerate(const std::string& model_path, const std::string& prompt,
                      const std::vector<std::string>& extra = {},
                      nlohmann::json* json = nullptr) {
  std::vector<std::string> argv = {BinaryPath("cli/estuary"), "generate",
                                   "--model",                 model_path,
                                   "--prompt",                prompt,
                                   "--max-tokens",            "200",
                                   "--temperature",           "0",
                                   "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto result = RunProcess(argv);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return {};
  EXPECT_EQ(result->exit_code, 0) << result->err;
  const nlohmann::json out =
      nlohmann::json::parse(result->out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(out.is_object()) << "not JSON: " << result->out << result->err;
  if (!out.is_object()) return {};
  EXPECT_TRUE(out.contains("tokens_per_second"));
  EXPECT_TRUE(out.contains("completion_text"));
  if (json != nullptr) *json = out;
  return {out["prompt_ids"].get<std::vector<int32_t>>(),
          out["completion_ids"].get<std::vector<int32_t>>()};
}

// Folders written by Converted(), removed when the test binary ends.
std::map<std::string, std::string>& ConvertedFolders() {
  static auto* folders = new std::map<std::string, std::string>();
  return *folders;
}

class RemoveConvertedFolders : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    for (const auto& [key, folder] : ConvertedFolders()) fs::remove_all(folder, ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new RemoveConvertedFolders());

// Writes a shipped model to a Hugging Face folder once per (command, model, dtype) per test
// binary run: `estuary convert`, or `estuary widen` with `extra` flags.
std::string Written(const std::string& command, const std::string& model,
                    const std::string& dtype, const std::vector<std::string>& extra = {}) {
  std::map<std::string, std::string>* done = &ConvertedFolders();
  const std::string key = absl::StrCat(command, "/", model, "/", dtype);
  if (auto it = done->find(key); it != done->end()) return it->second;
  const fs::path out = fs::temp_directory_path() / absl::StrCat("estuary-golden-", ::getpid(), "-",
                                                                command, "-", model, "-", dtype);
  std::vector<std::string> argv = {BinaryPath("cli/estuary"), command, "--from", ModelDir(model),
                                   "--to", out.string(), "--dtype", dtype};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto result = RunProcess(argv);
  EXPECT_TRUE(result.ok() && result->exit_code == 0)
      << (result.ok() ? result->err : result.status().ToString());
  (*done)[key] = out.string();
  return out.string();
}

std::string Converted(const std::string& model, const std::string& dtype) {
  return Written("convert", model, dtype);
}

std::string CaseName(const ::testing::TestParamInfo<GoldenCase>& info) {
  return absl::StrCat(info.param.model, "_case", info.param.index);
}

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, Llama2cFolderMatchesGoldenIds) {
  const GoldenCase& c = GetParam();
  const Generated got = RunGenerate(ModelDir(c.model), c.prompt);
  EXPECT_EQ(got.prompt_ids, c.prompt_ids);
  EXPECT_EQ(got.completion_ids, c.completion_ids);
}

TEST_P(GoldenTest, ConvertedF32HuggingFaceFolderMatchesGoldenIds) {
  const GoldenCase& c = GetParam();
  const Generated got = RunGenerate(Converted(c.model, "f32"), c.prompt);
  EXPECT_EQ(got.prompt_ids, c.prompt_ids);
  EXPECT_EQ(got.completion_ids, c.completion_ids);
}

// Tensor parallelism over two CPU ranks (threads of the one process) gives the golden ids too.
TEST_P(GoldenTest, TensorParallelSizeTwoMatchesGoldenIds) {
  const GoldenCase& c = GetParam();
  const Generated got =
      RunGenerate(ModelDir(c.model), c.prompt, {"--tensor-parallel-size", "2"});
  EXPECT_EQ(got.prompt_ids, c.prompt_ids);
  EXPECT_EQ(got.completion_ids, c.completion_ids);
}

// --threads is the process's, shared among the ranks: 3 threads at TP 2 are 1 per rank.
TEST_P(GoldenTest, TensorParallelRanksShareTheThreads) {
  const GoldenCase& c = GetParam();
  nlohmann::json json;
  const Generated got = RunGenerate(ModelDir(c.model), c.prompt,
                                    {"--tensor-parallel-size", "2", "--threads", "3"}, &json);
  EXPECT_EQ(got.completion_ids, c.completion_ids);
  EXPECT_EQ(json.value("threads", 0), 2);
}

// The kernels split their rows among --threads threads (the default: every core); one thread
// and three (an odd split, more than CI's cores) give the golden ids, and the JSON says how many
// threads decoded.
TEST_P(GoldenTest, AnyThreadCountMatchesGoldenIds) {
  const GoldenCase& c = GetParam();
  for (const std::string threads : {"1", "3"}) {
    nlohmann::json json;
    const Generated got = RunGenerate(ModelDir(c.model), c.prompt, {"--threads", threads}, &json);
    EXPECT_EQ(got.completion_ids, c.completion_ids) << "--threads " << threads;
    EXPECT_EQ(json.value("threads", 0), std::stoi(threads));
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, GoldenTest, ::testing::ValuesIn(AllGoldenCases()), CaseName);

// stories12L widened into preset "small" (dim 128 -> 512, head_dim 16 -> 64: every scale of the
// widening a power of two) computes the same function: in f32 it reproduces the golden ids.
TEST(GoldenWidenTest, WidenedF32HuggingFaceFolderMatchesGoldenIds) {
  const std::string widened = Written("widen", "stories12L", "f32", {"--preset", "small"});
  const nlohmann::json config = nlohmann::json::parse(
      std::ifstream(fs::path(widened) / "config.json"), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(config.is_object());
  EXPECT_EQ(config.value("hidden_size", 0), 512);  // really wider
  EXPECT_EQ(config.value("head_dim", 64), 64);
  // Three cases (600 tokens) show it; each case is a process generating 200 tokens.
  const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases("stories12L");
  ASSERT_GE(cases.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const GoldenCase& c = cases[i];
    const Generated got = RunGenerate(widened, c.prompt);
    EXPECT_EQ(got.prompt_ids, c.prompt_ids) << c.prompt;
    EXPECT_EQ(got.completion_ids, c.completion_ids) << c.prompt;
  }
  // Narrower than the model: refused, naming the width.
  auto refused = RunProcess({BinaryPath("cli/estuary"), "widen", "--from", ModelDir("stories12L"),
                             "--preset", "tiny", "--to", widened + "-tiny"});
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->exit_code, 2);
  EXPECT_NE(refused->err.find("dim (64) is smaller than the model's (128)"), std::string::npos)
      << refused->err;
}

// bf16 weights: report the share of golden tokens reproduced, position by position.
TEST(GoldenBf16Test, ShareOfIdenticalTokens) {
  for (const std::string& model : ::estuary::testing::GoldenModels()) {
    size_t same = 0, total = 0, prefix_same = 0;
    for (const GoldenCase& c : ::estuary::testing::LoadGoldenCases(model)) {
      const Generated got = RunGenerate(Converted(model, "bf16"), c.prompt);
      EXPECT_EQ(got.prompt_ids, c.prompt_ids);
      const size_t n = std::max(got.completion_ids.size(), c.completion_ids.size());
      bool in_prefix = true;
      for (size_t i = 0; i < n; ++i) {
        const bool equal = i < got.completion_ids.size() && i < c.completion_ids.size() &&
                           got.completion_ids[i] == c.completion_ids[i];
        same += equal;
        in_prefix = in_prefix && equal;
        prefix_same += in_prefix;
      }
      total += n;
    }
    ASSERT_GT(total, 0u);
    const double share = static_cast<double>(same) / static_cast<double>(total);
    std::printf("bf16 %s: %zu of %zu golden tokens identical (%.1f%%), %zu before the first "
                "divergence (%.1f%%)\n",
                model.c_str(), same, total, 100.0 * share, prefix_same,
                100.0 * static_cast<double>(prefix_same) / static_cast<double>(total));
    RecordProperty(absl::StrCat(model, "_bf16_identical_share"), absl::StrCat(share));
    // A broken bf16 path (wrong widening, wrong rounding) lands near zero.
    EXPECT_GT(share, 0.2) << model;
  }
}

}  // namespace
}  // namespace estuary
