#include "process/flag_spelling.h"

#include <algorithm>

#include "absl/flags/parse.h"

namespace estuary::process {

std::vector<std::string> DashesToUnderscores(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    // --config FILE (or --config=FILE) is absl's --flagfile: one flag per line.
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) {
      args.push_back(std::string("--flagfile=") + argv[++i]);
    } else if (arg.rfind("--config=", 0) == 0) {
      args.push_back("--flagfile=" + arg.substr(9));
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
