#include "process/command_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "process/flag_spelling.h"

namespace estuary::process {
namespace {

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string Dashed(const std::string& name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

const std::string& LabelOf(const CommandFlags& command) {
  return command.label.empty() ? command.program : command.label;
}

bool IsBool(const std::string& name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->IsOfType<bool>();
}

absl::Status NotApplicable(const std::string& name, const CommandFlags& command,
                           absl::Span<const CommandFlags> siblings) {
  std::vector<std::string> owners;
  for (const CommandFlags& sibling : siblings) {
    if (&sibling != &command && Contains(sibling.flags, name)) owners.push_back(LabelOf(sibling));
  }
  if (owners.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag --", Dashed(name), " for `", command.program, "`"));
  }
  return absl::InvalidArgumentError(absl::StrCat("--", Dashed(name), " does not apply to `",
                                                 command.program, "` (it is a flag of: ",
                                                 absl::StrJoin(owners, ", "), ")"));
}

}  // namespace

absl::StatusOr<CheckedCommandLine> CheckCommandLine(const std::vector<std::string>& args,
                                                    const CommandFlags& command,
                                                    absl::Span<const CommandFlags> siblings) {
  CheckedCommandLine checked;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      if (i + 1 < args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i + 1],
                                                       "' (`", command.program,
                                                       "` takes flags only)"));
      }
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", arg, "' (`", command.program, "` takes flags only)"));
    }
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const size_t equals = arg.find('=');
    const std::string name = arg.substr(dashes, std::min(equals, arg.size()) - dashes);
    const bool has_value = equals != std::string::npos;
    if (std::find(std::begin(kHelpFlags), std::end(kHelpFlags), name) != std::end(kHelpFlags)) {
      checked.help = true;
      continue;
    }
    if (Contains(command.flags, name)) {
      checked.given.insert(name);
      if (!has_value && !IsBool(name)) ++i;  // --flag VALUE
      continue;
    }
    // absl's --noflag spelling of a bool flag.
    if (name.rfind("no", 0) == 0 && !has_value && Contains(command.flags, name.substr(2)) &&
        IsBool(name.substr(2))) {
      checked.given.insert(name.substr(2));
      continue;
    }
    return NotApplicable(name, command, siblings);
  }
  return checked;
}

std::string HelpText(const CommandFlags& command) {
  std::string text = absl::StrCat("usage: ", command.program, " [flags]\n");
  if (!command.summary.empty()) absl::StrAppend(&text, command.summary, "\n");
  absl::StrAppend(&text, "\nflags:\n");
  for (const std::string& name : command.flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      absl::StrAppend(&text, "  --", Dashed(name), "  (not defined in this binary)\n");
      continue;
    }
    std::string default_value = flag->DefaultValue();
    if (default_value.empty()) default_value = "\"\"";
    absl::StrAppend(&text, "  --", Dashed(name), " (default: ", default_value, ")\n      ",
                    flag->Help(), "\n");
  }
  absl::StrAppend(&text,
                  "  --config FILE\n      read flags from FILE, one --flag=value a line as on "
                  "the command line ('#' comments); later flags win\n"
                  "  --help\n      this text\n");
  return text;
}

std::vector<std::string> UndefinedFlags(const CommandFlags& command) {
  std::vector<std::string> undefined;
  for (const std::string& name : command.flags) {
    if (absl::FindCommandLineFlag(name) == nullptr) undefined.push_back(name);
  }
  return undefined;
}

std::set<std::string> ParseCommandFlags(int argc, char** argv, const CommandFlags& command,
                                        absl::Span<const CommandFlags> siblings) {
  std::vector<std::string> args = DashesToUnderscores(argc, argv);
  absl::StatusOr<CheckedCommandLine> checked = CheckCommandLine(args, command, siblings);
  if (!checked.ok()) {
    std::fprintf(stderr, "error: %s\nRun `%s --help` for its flags.\n",
                 std::string(checked.status().message()).c_str(), command.program.c_str());
    std::exit(2);
  }
  if (checked->help) {
    std::fputs(HelpText(command).c_str(), stdout);
    std::exit(0);
  }
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return checked->given;
}

}  // namespace estuary::process
