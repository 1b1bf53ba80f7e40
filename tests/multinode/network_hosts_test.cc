// NetworkHosts: nodes get their addresses and default route, reach the test and each other,
// resolve the test's host names (several addresses for one name), lose their link on demand,
// run programs with their own pids, and leave nothing behind. Needs root; skips elsewhere.

#include "tests/multinode/network_hosts.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/child_process.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace estuary::testing {
namespace {

namespace fs = std::filesystem;

#define CREATE_OR_SKIP(hosts, nodes)                                         \
  absl::StatusOr<std::unique_ptr<NetworkHosts>> hosts##_made = NetworkHosts::Create(nodes); \
  if (!hosts##_made.ok() &&                                                  \
      hosts##_made.status().code() == absl::StatusCode::kFailedPrecondition) { \
    GTEST_SKIP() << hosts##_made.status();                                   \
  }                                                                          \
  ASSERT_TRUE(hosts##_made.ok()) << hosts##_made.status();                   \
  std::unique_ptr<NetworkHosts> hosts = std::move(*hosts##_made)

// A TCP listener of the test process on `address` (connects succeed through the backlog).
class Listener {
 public:
  explicit Listener(const std::string& address) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    ::inet_pton(AF_INET, address.c_str(), &in.sin_addr);
    socklen_t length = sizeof(in);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&in), length) == 0 && ::listen(fd_, 16) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&in), &length) == 0) {
      port_ = ntohs(in.sin_port);
    }
  }
  ~Listener() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Runs `script` with bash inside `node`; its result.
absl::StatusOr<ProcessResult> InNode(const NetworkHosts& hosts, const std::string& node,
                                     const std::string& script,
                                     absl::Duration timeout = absl::Seconds(10)) {
  return RunProcess(hosts.Command(node, {"bash", "-c", script}), timeout);
}

std::string ConnectScript(const std::string& address, int port) {
  return absl::StrCat("exec 3<>/dev/tcp/", address, "/", port);
}

// Every trace of the harness for pid `pid`: namespaces, the root link, /etc/netns folders.
std::vector<std::string> Leftovers(int pid) {
  std::vector<std::string> left;
  absl::StatusOr<ProcessResult> netns = RunProcess({"/usr/sbin/ip", "netns", "list"});
  if (netns.ok() && netns->out.find(absl::StrCat("est", pid)) != std::string::npos) {
    left.push_back("namespaces:\n" + netns->out);
  }
  absl::StatusOr<ProcessResult> links = RunProcess({"/usr/sbin/ip", "-o", "link", "show"});
  if (links.ok() && links->out.find(absl::StrCat("esh", pid)) != std::string::npos) {
    left.push_back("links:\n" + links->out);
  }
  std::error_code ec;
  if (fs::is_directory("/etc/netns", ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator("/etc/netns", ec)) {
      if (e.path().filename().string().rfind(absl::StrCat("est", pid), 0) == 0) {
        left.push_back(e.path().string());
      }
    }
  }
  return left;
}

TEST(NetworkHostsTest, NodesHaveAddressesAndADefaultRouteAndReachEachOther) {
  CREATE_OR_SKIP(hosts, (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_NE(hosts->address("alpha"), hosts->address("beta"));
  EXPECT_EQ(hosts->address("alpha").rfind("198.1", 0), 0u) << hosts->address("alpha");
  absl::StatusOr<ProcessResult> route = InNode(*hosts, "alpha", "ip route show default");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_NE(route->out.find("via " + hosts->gateway_address()), std::string::npos) << route->out;
  EXPECT_NE(route->out.find(hosts->interface_name("alpha")), std::string::npos) << route->out;
  absl::StatusOr<ProcessResult> addresses =
      InNode(*hosts, "alpha", "ip -o -4 addr show dev " + hosts->interface_name("alpha"));
  ASSERT_TRUE(addresses.ok());
  EXPECT_NE(addresses->out.find(hosts->address("alpha") + "/24"), std::string::npos);

  Listener listener(hosts->bridge_address());
  ASSERT_GT(listener.port(), 0);
  for (const char* node : {"alpha", "beta"}) {
    absl::StatusOr<ProcessResult> connected =
        InNode(*hosts, node, ConnectScript(hosts->bridge_address(), listener.port()));
    ASSERT_TRUE(connected.ok()) << connected.status();
    EXPECT_EQ(connected->exit_code, 0) << node << ": " << connected->err;
  }
  // Node to node: beta listens (bash cannot, so a node reaches the other's closed port and is
  // refused at once, which proves the path: an unreachable one would time out).
  absl::StatusOr<ProcessResult> refused =
      InNode(*hosts, "alpha", ConnectScript(hosts->address("beta"), 9), absl::Seconds(5));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_NE(refused->exit_code, 0);
  EXPECT_NE(refused->err.find("refused"), std::string::npos) << refused->err;
}

TEST(NetworkHostsTest, HostsFileNamesSeveralAddressesAndRewritesReachRunningProcesses) {
  CREATE_OR_SKIP(hosts, (std::vector<std::string>{"client", "w1", "w2"}));
  ASSERT_TRUE(hosts->SetHosts({{"workers", {hosts->address("w1"), hosts->address("w2")}}}).ok());
  absl::StatusOr<ProcessResult> both = InNode(*hosts, "client", "getent ahostsv4 workers");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_NE(both->out.find(hosts->address("w1")), std::string::npos) << both->out;
  EXPECT_NE(both->out.find(hosts->address("w2")), std::string::npos) << both->out;
  // A process already running sees a rewrite (the file is rewritten in place).
  const std::string log = (fs::temp_directory_path() / absl::StrCat("nh-", ::getpid())).string();
  absl::StatusOr<std::unique_ptr<ChildProcess>> watcher = ChildProcess::Start(
      hosts->Command("client",
                     {"bash", "-c", "while true; do getent hosts late && exit 0; sleep 0.05; done"}),
      log);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(hosts->SetHosts({{"late", {hosts->address("w2")}}}).ok());
  absl::StatusOr<int> exited = (*watcher)->Wait(absl::Seconds(5));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, 0);
  EXPECT_NE((*watcher)->Log().find(hosts->address("w2")), std::string::npos);
  fs::remove(log);
  EXPECT_EQ(hosts->SetHosts({{"bad name", {"198.18.0.9"}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hosts->SetHosts({{"name", {"not-an-address"}}}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NetworkHostsTest, APulledCableTimesOutAndPluggingItBackRestores) {
  CREATE_OR_SKIP(hosts, (std::vector<std::string>{"node"}));
  Listener listener(hosts->bridge_address());
  const std::string connect = ConnectScript(hosts->bridge_address(), listener.port());
  ASSERT_TRUE(hosts->SetLinkUp("node", false).ok());
  absl::StatusOr<ProcessResult> cut = InNode(*hosts, "node", connect, absl::Seconds(2));
  EXPECT_TRUE(!cut.ok() || cut->exit_code != 0) << "connected through a pulled cable";
  if (!cut.ok()) EXPECT_EQ(cut.status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(hosts->SetLinkUp("node", true).ok());
  absl::StatusOr<ProcessResult> back;
  for (int attempt = 0; attempt < 20; ++attempt) {  // carrier and neighbour entries come back
    back = InNode(*hosts, "node", connect, absl::Seconds(3));
    if (back.ok() && back->exit_code == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->exit_code, 0) << back->err;
  EXPECT_EQ(hosts->SetLinkUp("nobody", false).code(), absl::StatusCode::kNotFound);
}

TEST(NetworkHostsTest, ProgramsKeepTheirPidAndSignalsReachThem) {
  CREATE_OR_SKIP(hosts, (std::vector<std::string>{"node"}));
  const std::string log = (fs::temp_directory_path() / absl::StrCat("nh-pid-", ::getpid())).string();
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(hosts->Command("node", {"bash", "-c", "echo $$; exec sleep 30"}), log);
  ASSERT_TRUE(child.ok()) << child.status();
  std::string printed;
  for (int i = 0; i < 100 && printed.find('\n') == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    printed = (*child)->Log();
  }
  EXPECT_EQ(printed.substr(0, printed.find('\n')), std::to_string((*child)->pid()));
  (*child)->Signal(SIGTERM);
  absl::StatusOr<int> exited = (*child)->Wait(absl::Seconds(5));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, -SIGTERM);
  fs::remove(log);
}

TEST(NetworkHostsTest, NothingIsLeftBehindEvenWithProgramsStillRunning) {
  {
    CREATE_OR_SKIP(hosts, (std::vector<std::string>{"a", "b"}));
    // A program the test forgot: the teardown kills it.
    absl::StatusOr<ProcessResult> started =
        RunProcess(hosts->Command("a", {"bash", "-c", "(setsid sleep 60 >/dev/null 2>&1 &) ; exit 0"}));
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_FALSE(Leftovers(::getpid()).empty()) << "the check must see what exists";
  }
  const std::vector<std::string> left = Leftovers(::getpid());
  EXPECT_TRUE(left.empty()) << left.front();
}

TEST(NetworkHostsTest, OneAtATimeAndNamesAreChecked) {
  CREATE_OR_SKIP(hosts, (std::vector<std::string>{"only"}));
  EXPECT_EQ(NetworkHosts::Create({"second"}).status().code(), absl::StatusCode::kAlreadyExists);
  hosts.reset();
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{}, {"has space"}, {"dup", "dup"}, {std::string(41, 'x')},
        {"sl/ash"}}) {
    EXPECT_EQ(NetworkHosts::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace estuary::testing
