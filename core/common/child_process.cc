#include "core/common/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace estuary {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("no program");
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    // Child: no signal mask or handlers inherited from the test, output to the log.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(log);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void ChildProcess::Signal(int signal) {
  if (!reaped_) ::kill(pid_, signal);
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (reaped_) return exit_code_;
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      return exit_code_;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("process ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::string> WaitForReadyFile(const std::string& path, ChildProcess& child,
                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    if (child.Wait(absl::ZeroDuration()).ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the process exited before it was ready:\n", child.Log()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("no ready file ", path, ":\n", child.Log()));
}

absl::StatusOr<ServingProcess> StartServing(const std::string& binary,
                                            const std::vector<std::string>& flags,
                                            const std::string& prefix, absl::Duration timeout,
                                            const std::vector<std::string>& launcher) {
  const std::string ready = prefix + ".ready";
  ::unlink(ready.c_str());
  std::vector<std::string> argv = launcher;
  argv.insert(argv.end(), {binary, "--ready-file", ready});
  argv.insert(argv.end(), flags.begin(), flags.end());
  ServingProcess serving;
  absl::StatusOr<std::unique_ptr<ChildProcess>> process = ChildProcess::Start(argv, prefix + ".log");
  if (!process.ok()) return process.status();
  serving.process = std::move(*process);
  absl::StatusOr<std::string> address = WaitForReadyFile(ready, *serving.process, timeout);
  if (!address.ok()) return address.status();
  serving.address = *address;
  return serving;
}

}  // namespace estuary
