// Every `estuary` subcommand and every server binary as a user types them: `--help` lists the
// command's own flags (and no table entry the binary lacks), another command's flag is refused
// with exit status 2 naming it and its commands, config files pass the same check, and flags
// that cannot apply (--gpu-memory-utilization on the CPU, a bad --dtype or --kv-cache-memory, a
// --max-model-len beyond the model) are refused before anything serves. No model is served.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {
namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::ProcessResult;
using ::estuary::testing::RunProcess;

constexpr char kModel[] = "models/stories260K";  // in the repository

ProcessResult RunCommand(const std::vector<std::string>& argv) {
  absl::StatusOr<ProcessResult> result = RunProcess(argv, absl::Seconds(60));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : ProcessResult{};
}

std::string Estuary() { return BinaryPath("cli/estuary"); }

struct HelpCase {
  std::vector<std::string> argv;       // without --help
  std::string usage;                   // "usage: ..." line start
  std::vector<std::string> listed;     // flags that must appear
  std::vector<std::string> not_listed; // another command's flags
};

std::vector<HelpCase> HelpCases() {
  return {
      {{Estuary(), "generate"}, "usage: estuary generate",
       {"--model", "--max-tokens", "--temperature", "--dtype", "--river", "--bf16-kernel"},
       {"--num-requests"}},
      {{Estuary(), "up"}, "usage: estuary up",
       {"--prefill", "--decode", "--api-key", "--max-model-len", "--served-model-name",
        "--kv-cache-memory", "--max-num-seqs", "--exit-threshold", "--metrics-port"},
       {"--prompt", "--batch"}},
      {{Estuary(), "client"}, "usage: estuary client", {"--server", "--api-key", "--prompt"},
       {"--batch", "--prefill"}},
      {{Estuary(), "bench-serve"}, "usage: estuary bench-serve",
       {"--server", "--num-requests", "--rate", "--api-key"}, {"--prompt ", "--taus"}},
      {{Estuary(), "convert"}, "usage: estuary convert", {"--from", "--to", "--dtype"},
       {"--server", "--model "}},
      {{Estuary(), "synth"}, "usage: estuary synth", {"--preset", "--out"}, {"--model "}},
      {{Estuary(), "eval-exit"}, "usage: estuary eval-exit",
       {"--taus", "--prompts", "--exit-rule"}, {"--rate"}},
      {{Estuary(), "bench-decode"}, "usage: estuary bench-decode",
       {"--batch", "--exit-after", "--steps"}, {"--num-requests", "--dtype"}},
      {{Estuary(), "bench-prefill"}, "usage: estuary bench-prefill",
       {"--tp-sizes", "--prompt-tokens", "--max-num-batched-tokens"}, {"--batch "}},
      {{Estuary(), "bench-kv"}, "usage: estuary bench-kv", {"--tls", "--quick", "--perftest"},
       {"--model "}},
      {{BinaryPath("router/estuary-router")}, "usage: estuary-router",
       {"--model", "--http-port", "--api-key", "--served-model-name", "--max-model-len",
        "--policy"},
       {"--max-num-seqs", "--river"}},
      {{BinaryPath("prefill/estuary-prefill")}, "usage: estuary-prefill",
       {"--model", "--kv-cache-memory", "--kv-cache-bytes", "--max-model-len", "--dtype",
        "--max-num-seqs", "--gpu-memory-utilization"},
       {"--river", "--api-key", "--policy"}},
      {{BinaryPath("decode/estuary-decode")}, "usage: estuary-decode",
       {"--model", "--river", "--exit-threshold", "--exit-rule", "--min-backbone-layers",
        "--max-backbone-layers", "--river-group-size", "--river-lm-head", "--kv-cache-memory",
        "--max-model-len",
        "--lease-ms"},
       {"--policy", "--api-key"}},
  };
}

TEST(CommandHelpTest, EveryCommandListsItsOwnFlags) {
  for (const HelpCase& c : HelpCases()) {
    std::vector<std::string> argv = c.argv;
    argv.push_back("--help");
    const ProcessResult result = RunCommand(argv);
    SCOPED_TRACE(c.usage);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_EQ(result.out.rfind(c.usage, 0), 0u) << result.out;
    EXPECT_EQ(result.out.find("not defined in this binary"), std::string::npos) << result.out;
    EXPECT_EQ(result.out.find("No flags matched"), std::string::npos) << result.out;
    for (const std::string& flag : c.listed) {
      EXPECT_NE(result.out.find("  " + flag + " (default: "), std::string::npos)
          << flag << " missing from:\n" << result.out;
    }
    for (const std::string& flag : c.not_listed) {
      EXPECT_EQ(result.out.find("  " + flag), std::string::npos)
          << flag << " listed in:\n" << result.out;
    }
  }
}

TEST(CommandHelpTest, TopLevelHelpListsTheCommandsAndEveryFlagHasACommand) {
  const ProcessResult result = RunCommand({Estuary(), "--help"});
  EXPECT_EQ(result.exit_code, 0);
  for (const char* command : {"generate", "up", "client", "bench-serve", "convert", "synth",
                              "eval-exit", "bench-decode", "bench-prefill", "bench-kv"}) {
    EXPECT_NE(result.out.find(std::string("  ") + command + " "), std::string::npos) << command;
  }
  EXPECT_EQ(result.out.find("internal:"), std::string::npos) << result.out;
  EXPECT_EQ(RunCommand({Estuary()}).exit_code, 2);
  const ProcessResult unknown = RunCommand({Estuary(), "serve"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown command 'serve'"), std::string::npos) << unknown.err;
}

struct RefusalCase {
  std::vector<std::string> argv;
  std::string message;
};

TEST(CommandFlagsRefusalTest, AFlagOfAnotherCommandIsRefusedNamingIt) {
  const std::vector<RefusalCase> cases = {
      {{Estuary(), "generate", "--num-requests", "3"},
       "error: --num-requests does not apply to `estuary generate` (it is a flag of: "
       "bench-serve)"},
      {{Estuary(), "bench-decode", "--model", kModel, "--dtype", "bf16"},
       "error: --dtype does not apply to `estuary bench-decode` (it is a flag of: generate, up, "
       "convert, widen, bench-prefill)"},
      {{Estuary(), "client", "--server=x:1", "--max_num_seqs=4"},
       "error: --max-num-seqs does not apply to `estuary client` (it is a flag of: up)"},
      {{Estuary(), "up", "--prompt", "hi"},
       "error: --prompt does not apply to `estuary up`"},
      {{Estuary(), "generate", "--no-such-flag"}, "error: unknown flag --no-such-flag"},
      {{Estuary(), "generate", "stray"}, "error: unexpected argument 'stray'"},
      {{BinaryPath("prefill/estuary-prefill"), "--model", kModel, "--river"},
       "error: --river does not apply to `estuary-prefill` (it is a flag of: estuary-decode)"},
      {{BinaryPath("router/estuary-router"), "--model", kModel, "--max-num-seqs", "8"},
       "error: --max-num-seqs does not apply to `estuary-router` (it is a flag of: "
       "estuary-prefill, estuary-decode)"},
      {{BinaryPath("decode/estuary-decode"), "--model", kModel, "--policy", "round_robin"},
       "error: --policy does not apply to `estuary-decode` (it is a flag of: estuary-router)"},
  };
  for (const RefusalCase& c : cases) {
    const ProcessResult result = RunCommand(c.argv);
    EXPECT_EQ(result.exit_code, 2) << c.message << "\n" << result.err;
    EXPECT_NE(result.err.find(c.message), std::string::npos)
        << "want: " << c.message << "\ngot: " << result.err;
    EXPECT_NE(result.err.find("--help` for its flags"), std::string::npos) << result.err;
  }
}

TEST(CommandFlagsRefusalTest, ConfigFilesAreCheckedLikeTheCommandLine) {
  const fs::path config = fs::temp_directory_path() / "estuary-cli-test-decode.flags";
  std::ofstream(config) << "# decode worker\n--model=" << kModel << "\n--policy=round_robin\n";
  const ProcessResult result =
      RunCommand({BinaryPath("decode/estuary-decode"), "--config", config.string()});
  fs::remove(config);
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find("--policy does not apply to `estuary-decode`"), std::string::npos)
      << result.err;
}

TEST(CommandFlagsRefusalTest, FlagsThatCannotApplyAreRefusedBeforeServing) {
  const std::string decode = BinaryPath("decode/estuary-decode");
  const std::string prefill = BinaryPath("prefill/estuary-prefill");
  const std::vector<RefusalCase> cases = {
      {{decode, "--model", kModel, "--gpu-memory-utilization", "0.9"},
       "--gpu-memory-utilization applies to a CUDA device"},
      {{prefill, "--model", kModel, "--dtype", "f16"}, "--dtype = 'f16': use f32 or bf16"},
      {{decode, "--model", kModel, "--kv-cache-memory", "lots"}, "'lots' is not a memory size"},
      {{decode, "--model", kModel, "--max-model-len", "100000"},
       "--max-model-len = 100000 exceeds the model's context length"},
      {{BinaryPath("router/estuary-router"), "--model", kModel, "--max-model-len", "100000"},
       "--max-model-len = 100000 exceeds the model's context length"},
      {{prefill, "--model", kModel, "--bf16-kernel", "sideways"},
       "--bf16-kernel=sideways: use fma or dot"},
      {{Estuary(), "generate", "--model", kModel, "--bf16-kernel", "f16"},
       "--bf16-kernel=f16: use fma or dot"},
      {{decode, "--model", kModel, "--exit-rule", "split"},
       "--exit-rule applies to the exit river: add --river"},
      {{decode, "--model", kModel, "--river", "--exit-rule", "sideways"},
       "exit rule 'sideways': use batch_min, split or all_passed"},
      {{decode, "--model", kModel, "--river", "--max-backbone-layers", "99"},
       "--max-backbone-layers = 99"},
      {{Estuary(), "generate", "--model", kModel, "--river", "--int4-kernel", "sideways"},
       "--int4-kernel=sideways: use auto, vnni, avx2 or highway"},
      {{decode, "--model", kModel, "--river-lm-head", "int4"},
       "--river-lm-head applies to the exit river: add --river"},
      {{Estuary(), "generate", "--model", kModel, "--river", "--river-lm-head", "int8"},
       "--river-lm-head=int8: use shared or int4"},
  };
  for (const RefusalCase& c : cases) {
    const ProcessResult result = RunCommand(c.argv);
    EXPECT_NE(result.exit_code, 0) << c.message;
    EXPECT_NE(result.err.find(c.message), std::string::npos)
        << "want: " << c.message << "\ngot: " << result.err;
  }
}

}  // namespace
}  // namespace estuary
