// Flag spelling: dashes and underscores, and --config files spelled as the command line.
#include "process/flag_spelling.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace estuary::process {
namespace {

std::vector<std::string> Rewrite(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return DashesToUnderscores(static_cast<int>(argv.size()), argv.data());
}

TEST(FlagSpellingTest, DashesBecomeUnderscoresInNamesOnly) {
  EXPECT_EQ(Rewrite({"prog", "--max-tokens=8", "--prompt", "a-b", "--host=my-host"}),
            (std::vector<std::string>{"prog", "--max_tokens=8", "--prompt", "a-b",
                                      "--host=my-host"}));
}

TEST(FlagSpellingTest, ConfigFilesAreSpelledAsTheCommandLineAndComeFirst) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("flags-" + std::to_string(::getpid()))).string();
  {
    std::ofstream out(path);
    out << "# the decode role\n--shutdown-timeout=25s\n\n  --kv_cache_bytes=64  \n--river\n";
  }
  EXPECT_EQ(Rewrite({"prog", "--config", path, "--shutdown-timeout=5s"}),
            (std::vector<std::string>{"prog", "--shutdown_timeout=25s", "--kv_cache_bytes=64",
                                      "--river", "--shutdown_timeout=5s"}));
  EXPECT_EQ(Rewrite({"prog", "--config=" + path}).size(), 4u);
  std::filesystem::remove(path);
}

TEST(FlagSpellingDeathTest, ABadConfigFileStopsWithAMessage) {
  EXPECT_EXIT(Rewrite({"prog", "--config", "/nonexistent/flags"}), ::testing::ExitedWithCode(2),
              "cannot read");
  const std::string path =
      (std::filesystem::temp_directory_path() / ("bad-" + std::to_string(::getpid()))).string();
  {
    std::ofstream out(path);
    out << "--port=1\nmodel=/x\n";
  }
  EXPECT_EXIT(Rewrite({"prog", "--config", path}), ::testing::ExitedWithCode(2),
              ":2: 'model=/x' is not a flag");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace estuary::process
