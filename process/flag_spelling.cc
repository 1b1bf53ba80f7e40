#include "process/flag_spelling.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"

namespace estuary::process {
namespace {

// The flags of a --config file, in order: one `--flag=value` (or `--flag`) a line, spelled as
// on the command line; blank lines and lines starting with '#' are skipped. A file that cannot
// be read, or a line that is not a flag, ends the process with a message (status 2).
std::vector<std::string> ConfigFileFlags(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "--config %s: cannot read the file\n", path.c_str());
    std::exit(2);
  }
  std::vector<std::string> flags;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string flag(absl::StripAsciiWhitespace(line));
    if (flag.empty() || flag[0] == '#') continue;
    if (flag.rfind("--", 0) != 0 || flag.size() == 2) {
      std::fprintf(stderr, "--config %s:%d: '%s' is not a flag (expected --name=value)\n",
                   path.c_str(), number, flag.c_str());
      std::exit(2);
    }
    flags.push_back(flag);
  }
  return flags;
}

}  // namespace

std::vector<std::string> DashesToUnderscores(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    // --config FILE (or --config=FILE): the file's flags in its place, so that flags after it
    // on the command line win.
    const std::string arg = argv[i];
    if (i > 0 && arg == "--config" && i + 1 < argc) {
      for (std::string& flag : ConfigFileFlags(argv[++i])) args.push_back(std::move(flag));
    } else if (i > 0 && arg.rfind("--config=", 0) == 0) {
      for (std::string& flag : ConfigFileFlags(arg.substr(9))) args.push_back(std::move(flag));
    } else {
      args.push_back(arg);
    }
  }
  for (std::string& arg : args) {
    if (arg.rfind("--", 0) != 0) continue;
    const size_t name_end = std::min(arg.find('='), arg.size());
    for (size_t i = 2; i < name_end; ++i) {
      if (arg[i] == '-') arg[i] = '_';
    }
  }
  return args;
}

std::vector<std::string> ParseFlags(int argc, char** argv) {
  std::vector<std::string> args = DashesToUnderscores(argc, argv);
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace estuary::process
