// Per-command flag sets: a command accepts its own flags (dashes or underscores, --flag value,
// --flag=value, --noflag, from --config files), refuses another command's naming it and the
// commands that take it, refuses unknown flags and positional arguments, and prints its own
// flags in --help.
#include "process/command_flags.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"
#include "process/flag_spelling.h"

ABSL_FLAG(int, test_num_requests, 32, "requests to send");
ABSL_FLAG(int, test_max_tokens, 256, "new tokens at most");
ABSL_FLAG(bool, test_json, false, "print JSON");
ABSL_FLAG(std::string, test_prompt, "Once", "prompt text");

namespace estuary::process {
namespace {

const CommandFlags kGenerate{"estuary generate", "generate", "run one prompt",
                             {"test_max_tokens", "test_json", "test_prompt"}};
const CommandFlags kBench{"estuary bench-serve", "bench-serve", "load a router",
                          {"test_num_requests", "test_max_tokens", "test_json"}};
const CommandFlags kClient{"estuary client", "client", "one prompt", {"test_num_requests"}};
const std::vector<CommandFlags> kAll = {kGenerate, kBench, kClient};

absl::StatusOr<CheckedCommandLine> Check(std::vector<std::string> args,
                                         const CommandFlags& command = kGenerate) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return CheckCommandLine(DashesToUnderscores(static_cast<int>(argv.size()), argv.data()),
                          command, kAll);
}

TEST(CommandFlagsTest, AcceptsItsOwnFlagsInEverySpelling) {
  absl::StatusOr<CheckedCommandLine> checked =
      Check({"estuary", "--test-max-tokens", "8", "--test_prompt=a -b", "--test-json",
             "--notest-json"});
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_FALSE(checked->help);
  EXPECT_EQ(checked->given, (std::set<std::string>{"test_max_tokens", "test_prompt", "test_json"}));
}

TEST(CommandFlagsTest, AValueThatLooksLikeAFlagIsAValue) {
  // --test-prompt takes the next argument whatever it looks like (as absl does).
  absl::StatusOr<CheckedCommandLine> checked =
      Check({"estuary", "--test-prompt", "--test-num-requests"});
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->given, (std::set<std::string>{"test_prompt"}));
}

TEST(CommandFlagsTest, AnotherCommandsFlagIsRefusedNamingItsCommands) {
  absl::StatusOr<CheckedCommandLine> checked = Check({"estuary", "--test-num-requests", "3"});
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(checked.status().message(),
            "--test-num-requests does not apply to `estuary generate` (it is a flag of: "
            "bench-serve, client)");
}

TEST(CommandFlagsTest, UnknownFlagsAndPositionalArgumentsAreRefused) {
  absl::StatusOr<CheckedCommandLine> unknown = Check({"estuary", "--no-such-flag=1"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(), "unknown flag --no-such-flag for `estuary generate`");
  absl::StatusOr<CheckedCommandLine> positional = Check({"estuary", "stray"});
  ASSERT_FALSE(positional.ok());
  EXPECT_NE(positional.status().message().find("unexpected argument 'stray'"), std::string::npos);
  // --no<name> is only the negation of a bool flag.
  EXPECT_FALSE(Check({"estuary", "--notest-prompt"}).ok());
}

TEST(CommandFlagsTest, ConfigFilesPassTheSameCheck) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("cf_" + std::to_string(::getpid()) + ".flags"))
          .string();
  {
    std::ofstream out(path);
    out << "# a config\n--test-max-tokens=4\n--test-num-requests=2\n";
  }
  absl::StatusOr<CheckedCommandLine> refused = Check({"estuary", "--config", path});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--test-num-requests does not apply"),
            std::string::npos);
  absl::StatusOr<CheckedCommandLine> accepted = Check({"estuary", "--config", path}, kBench);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->given, (std::set<std::string>{"test_max_tokens", "test_num_requests"}));
  std::filesystem::remove(path);
}

TEST(CommandFlagsTest, HelpListsOnlyTheCommandsFlagsWithDefaults) {
  absl::StatusOr<CheckedCommandLine> checked = Check({"estuary", "--help"});
  ASSERT_TRUE(checked.ok());
  EXPECT_TRUE(checked->help);
  EXPECT_TRUE(Check({"estuary", "-h"})->help);
  const std::string help = HelpText(kGenerate);
  EXPECT_NE(help.find("usage: estuary generate [flags]"), std::string::npos) << help;
  EXPECT_NE(help.find("--test-max-tokens (default: 256)\n      new tokens at most"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("--test-prompt (default: Once)"), std::string::npos) << help;
  EXPECT_NE(help.find("--config FILE"), std::string::npos) << help;
  EXPECT_EQ(help.find("test-num-requests"), std::string::npos) << help;
}

TEST(CommandFlagsTest, NamesATableEntryThisBinaryDoesNotDefine) {
  const CommandFlags broken{"x", "", "", {"test_json", "never_defined_flag"}};
  EXPECT_EQ(UndefinedFlags(broken), std::vector<std::string>{"never_defined_flag"});
  EXPECT_NE(HelpText(broken).find("--never-defined-flag  (not defined in this binary)"),
            std::string::npos);
  EXPECT_TRUE(UndefinedFlags(kGenerate).empty());
}

}  // namespace
}  // namespace estuary::process
