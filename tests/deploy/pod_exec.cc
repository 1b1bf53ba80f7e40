// pod_exec: runs one container's command the way a container runtime would, for the
// pods-as-written test: in a mount namespace of its own with the pod's volumes bind-mounted
// at their mountPaths, with exactly the pod's environment, as the pod's user.
//
//   pod_exec [--bind SRC:DST[:ro]]... [--env NAME=VALUE]... [--user UID:GID] -- COMMAND ARGS...
//
// The network namespace is the caller's (run it under `ip netns exec`). COMMAND is looked up in
// the PATH given with --env, as a runtime looks up an image's command. Mount points must exist.
// Exits 127 (with a message) when a step fails before the exec.

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "pod_exec: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(127);
}

struct Bind {
  std::string source, target;
  bool read_only = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<Bind> binds;
  std::vector<std::string> env;
  long uid = -1, gid = -1;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "pod_exec: %s needs a value\n", arg.c_str());
      return 127;
    }
    const std::string value = argv[++i];
    if (arg == "--bind") {
      Bind bind;
      const size_t colon = value.find(':');
      if (colon == std::string::npos) {
        std::fprintf(stderr, "pod_exec: --bind %s: expected SRC:DST[:ro]\n", value.c_str());
        return 127;
      }
      bind.source = value.substr(0, colon);
      bind.target = value.substr(colon + 1);
      if (bind.target.size() > 3 && bind.target.compare(bind.target.size() - 3, 3, ":ro") == 0) {
        bind.target.resize(bind.target.size() - 3);
        bind.read_only = true;
      }
      binds.push_back(bind);
    } else if (arg == "--env") {
      env.push_back(value);
    } else if (arg == "--user") {
      if (std::sscanf(value.c_str(), "%ld:%ld", &uid, &gid) != 2) {
        std::fprintf(stderr, "pod_exec: --user %s: expected UID:GID\n", value.c_str());
        return 127;
      }
    } else {
      std::fprintf(stderr, "pod_exec: unknown option %s\n", arg.c_str());
      return 127;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "pod_exec: no command\n");
    return 127;
  }
  if (::unshare(CLONE_NEWNS) != 0) Fail("unshare(CLONE_NEWNS)");
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) Fail("make / private");
  // Every source is opened before anything is mounted: a volume mounted over a directory above
  // a later source (an emptyDir on /tmp with the checkout under /tmp) would hide it otherwise.
  std::vector<std::string> sources;
  for (const Bind& bind : binds) {
    const int fd = ::open(bind.source.c_str(), O_PATH | O_CLOEXEC);
    if (fd < 0) Fail("open " + bind.source);
    sources.push_back("/proc/self/fd/" + std::to_string(fd));
  }
  for (size_t b = 0; b < binds.size(); ++b) {
    const Bind& bind = binds[b];
    if (::mount(sources[b].c_str(), bind.target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      Fail("bind " + bind.source + " on " + bind.target);
    }
    if (bind.read_only &&
        ::mount(nullptr, bind.target.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY,
                nullptr) != 0) {
      Fail("read-only " + bind.target);
    }
  }
  ::clearenv();
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || ::setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1) != 0) {
      Fail("--env " + e);
    }
  }
  if (gid >= 0) {
    if (::setgroups(0, nullptr) != 0) Fail("setgroups");
    if (::setgid(static_cast<gid_t>(gid)) != 0) Fail("setgid");
  }
  if (uid >= 0 && ::setuid(static_cast<uid_t>(uid)) != 0) Fail("setuid");
  ::execvp(argv[i], argv + i);
  Fail(std::string("exec ") + argv[i]);
}
