#include "tests/multinode/network_hosts.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "tests/testing/subprocess.h"

namespace estuary::testing {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kIpTimeout = absl::Seconds(20);
constexpr int kMaxNodes = 252;  // .2 .. .253; .1 is the test, .254 the gateway
constexpr size_t kMaxNodeName = 40;
// 198.18.0.0/15 holds 512 /24 subnets: 198.18.0.0 ... 198.19.255.0.
constexpr int kSubnets = 512;
const char kEtcNetns[] = "/etc/netns";

std::atomic<bool> g_live{false};  // one NetworkHosts per process

std::optional<std::string> FindIp() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return std::string(path);
  }
  return std::nullopt;
}

bool ValidNodeName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNodeName) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// "198.18.K.0/24" of subnet index `k` as (first three octets).
std::string SubnetPrefix(int k) { return absl::StrCat(198, ".", 18 + k / 256, ".", k % 256); }

// An IPv4 CIDR ("a.b.c.d/len" or a bare address: /32) as (network, length).
std::optional<std::pair<uint32_t, int>> ParseCidr(absl::string_view text) {
  std::vector<std::string> parts = absl::StrSplit(text, '/');
  in_addr address{};
  if (parts.empty() || ::inet_pton(AF_INET, parts[0].c_str(), &address) != 1) return std::nullopt;
  int length = 32;
  if (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &length) || length < 0 || length > 32)) {
    return std::nullopt;
  }
  const uint32_t host = ntohl(address.s_addr);
  const uint32_t mask = length == 0 ? 0 : ~uint32_t{0} << (32 - length);
  return std::make_pair(host & mask, length);
}

bool Overlap(std::pair<uint32_t, int> a, std::pair<uint32_t, int> b) {
  const int length = std::min(a.second, b.second);
  const uint32_t mask = length == 0 ? 0 : ~uint32_t{0} << (32 - length);
  return (a.first & mask) == (b.first & mask);
}

// Writes `value` to /proc/sys/<key> inside network namespace `ns` (a forked child joins it:
// /proc/sys/net is the opener's namespace). No shell and no procps needed.
absl::Status WriteSysctl(const std::string& ns, const std::string& key, const std::string& value) {
  const std::string ns_path = absl::StrCat("/run/netns/", ns);
  const std::string sys_path = absl::StrCat("/proc/sys/", key);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {  // async-signal-safe calls only
    const int ns_fd = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0 || ::setns(ns_fd, CLONE_NEWNET) != 0) ::_exit(2);
    const int fd = ::open(sys_path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) ::_exit(3);
    const bool ok = ::write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
    ::_exit(ok ? 0 : 4);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return absl::InternalError("waitpid failed");
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return absl::InternalError(absl::StrCat("writing ", sys_path, " in ", ns, " timed out"));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("writing ", value, " to ", sys_path, " in ", ns,
                                            " failed (step ", WEXITSTATUS(status), ")"));
  }
  return absl::OkStatus();
}

// Rewrites `path` in place (same inode: the bind mounts of running processes see it).
absl::Status RewriteInPlace(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    }
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

// The pid in a name made by this harness ("est123-router", "est123.gw", "esh123", ...), or -1.
int PidInName(absl::string_view name, absl::string_view prefix) {
  if (!absl::StartsWith(name, prefix)) return -1;
  name.remove_prefix(prefix.size());
  size_t digits = 0;
  while (digits < name.size() && absl::ascii_isdigit(static_cast<unsigned char>(name[digits]))) {
    ++digits;
  }
  int pid = -1;
  if (digits == 0 || !absl::SimpleAtoi(name.substr(0, digits), &pid)) return -1;
  return pid;
}

bool ProcessGone(int pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

absl::StatusOr<std::unique_ptr<NetworkHosts>> NetworkHosts::Create(
    const std::vector<std::string>& nodes) {
  if (nodes.empty() || static_cast<int>(nodes.size()) > kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrCat("between 1 and ", kMaxNodes, " nodes"));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!ValidNodeName(nodes[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node name '", nodes[i], "': letters, digits, '_' and '-', at most ", kMaxNodeName));
    }
    for (size_t j = 0; j < i; ++j) {
      if (nodes[i] == nodes[j]) {
        return absl::InvalidArgumentError(absl::StrCat("node '", nodes[i], "' named twice"));
      }
    }
  }
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError("network namespaces need root (this test runs as uid " +
                                         std::to_string(::geteuid()) + ")");
  }
  const std::optional<std::string> ip = FindIp();
  if (!ip.has_value()) {
    return absl::FailedPreconditionError("no `ip` binary (Debian: apt-get install iproute2)");
  }
  if (!fs::exists("/etc/hosts")) {
    return absl::FailedPreconditionError(
        "no /etc/hosts: `ip netns exec` would not bind-mount the nodes' hosts files");
  }
  if (g_live.exchange(true)) {
    return absl::AlreadyExistsError("another NetworkHosts of this process is alive");
  }
  std::unique_ptr<NetworkHosts> hosts(new NetworkHosts(*ip, static_cast<int>(::getpid())));
  hosts->RemoveStaleLeftovers();
  if (absl::Status built = hosts->Build(nodes); !built.ok()) {
    return built;  // the destructor removes what was made
  }
  return hosts;
}

NetworkHosts::NetworkHosts(std::string ip_path, int pid)
    : ip_path_(std::move(ip_path)),
      pid_(pid),
      prefix_(absl::StrCat("est", pid)),
      gateway_ns_(absl::StrCat("est", pid, ".gw")),
      root_link_(absl::StrCat("esh", pid)),
      gateway_link_(absl::StrCat("esg", pid)),
      bridge_(absl::StrCat("esb", pid)) {}

NetworkHosts::~NetworkHosts() {
  TearDown();
  g_live = false;
}

absl::StatusOr<std::string> NetworkHosts::Ip(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {ip_path_};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<ProcessResult> run = RunProcess(argv, kIpTimeout);
  const std::string command = absl::StrJoin(argv, " ");
  if (!run.ok()) return absl::InternalError(absl::StrCat(command, ": ", run.status().message()));
  if (run->exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(command, " exited ", run->exit_code, ": ", absl::StripAsciiWhitespace(run->err)));
  }
  return run->out;
}

absl::Status NetworkHosts::AddNamespace(const std::string& ns) {
  absl::StatusOr<std::string> added = Ip({"netns", "add", ns});
  if (!added.ok()) {
    // No permission or no kernel support: a machine where the test cannot run, not a failure.
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make network namespaces here: ", added.status().message()));
  }
  made_namespaces_.push_back(ns);
  return absl::OkStatus();
}

absl::Status NetworkHosts::Build(const std::vector<std::string>& nodes) {
  // A subnet that nothing in the root namespace overlaps (addresses or routes).
  std::vector<std::pair<uint32_t, int>> taken;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"-o", "-4", "addr", "show"},
        std::vector<std::string>{"-4", "route", "show", "table", "all"}}) {
    absl::StatusOr<std::string> out = Ip(args);
    if (!out.ok()) return out.status();
    for (absl::string_view line : absl::StrSplit(*out, '\n')) {
      for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        if (std::optional<std::pair<uint32_t, int>> cidr = ParseCidr(word)) {
          if (cidr->second > 0) taken.push_back(*cidr);  // never a default route
        }
      }
    }
  }
  int subnet = -1;
  for (int i = 0; i < kSubnets && subnet < 0; ++i) {
    const int k = (pid_ + i) % kSubnets;
    const std::pair<uint32_t, int> candidate = *ParseCidr(SubnetPrefix(k) + ".0/24");
    bool free = true;
    for (const auto& t : taken) free = free && !Overlap(candidate, t);
    if (free) subnet = k;
  }
  if (subnet < 0) return absl::FailedPreconditionError("all of 198.18.0.0/15 is in use here");
  ESTUARY_RETURN_IF_ERROR(BuildGateway(subnet));
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node node;
    node.name = nodes[i];
    node.ns = absl::StrCat(prefix_, "-", nodes[i]);
    node.address = absl::StrCat(SubnetPrefix(subnet), ".", i + 2);
    node.node_link = absl::StrCat("esv", pid_, "n", i);
    node.bridge_link = absl::StrCat("esv", pid_, "b", i);
    if (node.node_link.size() > 15) {
      return absl::InternalError(absl::StrCat("interface name ", node.node_link, " is too long"));
    }
    ESTUARY_RETURN_IF_ERROR(BuildNode(node));
    node_names_.push_back(node.name);
    nodes_.push_back(std::move(node));
  }
  return SetHosts({});
}

absl::Status NetworkHosts::BuildGateway(int subnet) {
  root_address_ = absl::StrCat(SubnetPrefix(subnet), ".1");
  gateway_address_ = absl::StrCat(SubnetPrefix(subnet), ".254");
  ESTUARY_RETURN_IF_ERROR(AddNamespace(gateway_ns_));
  // The gateway never forwards: nothing a node sends leaves the test network.
  ESTUARY_RETURN_IF_ERROR(WriteSysctl(gateway_ns_, "net/ipv4/ip_forward", "0"));
  (void)WriteSysctl(gateway_ns_, "net/ipv6/conf/all/forwarding", "0");  // IPv6 may be off
  ESTUARY_RETURN_IF_ERROR(Ip({"-n", gateway_ns_, "link", "add", bridge_, "type", "bridge"}).status());
  ESTUARY_RETURN_IF_ERROR(
      Ip({"-n", gateway_ns_, "addr", "add", gateway_address_ + "/24", "dev", bridge_}).status());
  ESTUARY_RETURN_IF_ERROR(Ip({"-n", gateway_ns_, "link", "set", bridge_, "up"}).status());
  ESTUARY_RETURN_IF_ERROR(Ip({"-n", gateway_ns_, "link", "set", "lo", "up"}).status());
  // The test's own leg: esh<pid> here, its peer on the gateway's bridge.
  made_root_link_ = true;
  ESTUARY_RETURN_IF_ERROR(Ip({"link", "add", root_link_, "type", "veth", "peer", "name",
                              gateway_link_, "netns", gateway_ns_})
                              .status());
  ESTUARY_RETURN_IF_ERROR(
      Ip({"-n", gateway_ns_, "link", "set", gateway_link_, "master", bridge_, "up"}).status());
  ESTUARY_RETURN_IF_ERROR(Ip({"addr", "add", root_address_ + "/24", "dev", root_link_}).status());
  return Ip({"link", "set", root_link_, "up"}).status();
}

absl::Status NetworkHosts::BuildNode(Node& node) {
  ESTUARY_RETURN_IF_ERROR(AddNamespace(node.ns));
  ESTUARY_RETURN_IF_ERROR(Ip({"-n", gateway_ns_, "link", "add", node.bridge_link, "type", "veth",
                              "peer", "name", node.node_link, "netns", node.ns})
                              .status());
  ESTUARY_RETURN_IF_ERROR(
      Ip({"-n", gateway_ns_, "link", "set", node.bridge_link, "master", bridge_, "up"}).status());
  // IPv4 only on the test network: no IPv6 link-local addresses for programs to pick.
  (void)WriteSysctl(node.ns, "net/ipv6/conf/all/disable_ipv6", "1");
  ESTUARY_RETURN_IF_ERROR(
      Ip({"-n", node.ns, "addr", "add", node.address + "/24", "dev", node.node_link}).status());
  ESTUARY_RETURN_IF_ERROR(Ip({"-n", node.ns, "link", "set", node.node_link, "up"}).status());
  ESTUARY_RETURN_IF_ERROR(Ip({"-n", node.ns, "link", "set", "lo", "up"}).status());
  ESTUARY_RETURN_IF_ERROR(
      Ip({"-n", node.ns, "route", "add", "default", "via", gateway_address_}).status());
  return WriteNodeFiles(node);
}

absl::Status NetworkHosts::WriteNodeFiles(const Node& node) {
  std::error_code ec;
  if (!fs::exists(kEtcNetns, ec)) {
    fs::create_directory(kEtcNetns, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", kEtcNetns, ": ", ec.message()));
    made_etc_netns_ = true;
  }
  const fs::path folder = fs::path(kEtcNetns) / node.ns;
  fs::create_directory(folder, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", folder.string(), ": ", ec.message()));
  made_folders_.push_back(folder.string());
  ESTUARY_RETURN_IF_ERROR(RewriteInPlace((folder / "hosts").string(), ""));
  // Files are bind-mounted only over files that exist in /etc.
  if (fs::exists("/etc/host.conf", ec)) {
    ESTUARY_RETURN_IF_ERROR(RewriteInPlace((folder / "host.conf").string(), "multi on\n"));
    multi_hosts_ = true;
  }
  if (fs::exists("/etc/resolv.conf", ec)) {
    // No DNS server on the test network: names not in the hosts file fail at once.
    ESTUARY_RETURN_IF_ERROR(RewriteInPlace((folder / "resolv.conf").string(),
                                           "# the multi-node test network has no DNS\n"));
  }
  return absl::OkStatus();
}

absl::Status NetworkHosts::SetHosts(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& entries) {
  std::string content = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n";
  for (const auto& [name, addresses] : entries) {
    if (name.empty() || std::any_of(name.begin(), name.end(), [](char c) {
          return absl::ascii_isspace(static_cast<unsigned char>(c));
        })) {
      return absl::InvalidArgumentError(absl::StrCat("host name '", name, "'"));
    }
    for (const std::string& address : addresses) {
      unsigned char buffer[sizeof(in6_addr)];
      if (::inet_pton(AF_INET, address.c_str(), buffer) != 1 &&
          ::inet_pton(AF_INET6, address.c_str(), buffer) != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", address, "' (for ", name, ") is not an IP address"));
      }
      absl::StrAppend(&content, address, " ", name, "\n");
    }
  }
  for (const Node& node : nodes_) {
    ESTUARY_RETURN_IF_ERROR(
        RewriteInPlace((fs::path(kEtcNetns) / node.ns / "hosts").string(), content));
  }
  return absl::OkStatus();
}

const NetworkHosts::Node& NetworkHosts::FindNode(const std::string& node) const {
  for (const Node& n : nodes_) {
    if (n.name == node) return n;
  }
  ESTUARY_LOG(ERROR) << "NetworkHosts: no node '" << node << "' (a test bug)";
  std::abort();
}

const std::string& NetworkHosts::address(const std::string& node) const {
  return FindNode(node).address;
}
const std::string& NetworkHosts::namespace_name(const std::string& node) const {
  return FindNode(node).ns;
}
const std::string& NetworkHosts::interface_name(const std::string& node) const {
  return FindNode(node).node_link;
}

std::vector<std::string> NetworkHosts::Command(const std::string& node,
                                               const std::vector<std::string>& argv) const {
  std::vector<std::string> command = {ip_path_, "netns", "exec", FindNode(node).ns};
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

absl::Status NetworkHosts::SetLinkUp(const std::string& node, bool up) {
  for (const Node& n : nodes_) {
    if (n.name == node) {
      return Ip({"-n", gateway_ns_, "link", "set", n.bridge_link, up ? "up" : "down"}).status();
    }
  }
  return absl::NotFoundError(absl::StrCat("no node '", node, "'"));
}

void NetworkHosts::KillAllIn(const std::string& node) { KillAllInNamespace(FindNode(node).ns); }

void NetworkHosts::KillAllInNamespace(const std::string& ns) {
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  const std::string own = fs::read_symlink("/proc/self/ns/net").string();
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> pids = Ip({"netns", "pids", ns});
    if (!pids.ok()) return;  // the namespace is gone
    bool any = false;
    for (absl::string_view word : absl::StrSplit(*pids, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
      int pid = 0;
      if (!absl::SimpleAtoi(word, &pid) || pid <= 1 || pid == pid_) continue;
      std::error_code ec;
      if (fs::read_symlink(absl::StrCat("/proc/", pid, "/ns/net"), ec).string() == own) continue;
      ::kill(pid, SIGKILL);
      any = true;
    }
    if (!any) return;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

void NetworkHosts::TearDown() {
  // Nodes first (newest first), then the gateway: deleting a namespace deletes its links, and
  // a veth pair goes with either end.
  for (auto it = made_namespaces_.rbegin(); it != made_namespaces_.rend(); ++it) {
    KillAllInNamespace(*it);
    if (absl::Status deleted = Ip({"netns", "del", *it}).status(); !deleted.ok()) {
      ESTUARY_LOG(WARNING) << "NetworkHosts: " << deleted;
    }
  }
  made_namespaces_.clear();
  if (made_root_link_) {
    // Gone with its peer in the gateway namespace; deleted here if the gateway never got it.
    (void)Ip({"link", "del", root_link_});
    made_root_link_ = false;
  }
  std::error_code ec;
  for (const std::string& folder : made_folders_) fs::remove_all(folder, ec);
  made_folders_.clear();
  if (made_etc_netns_) {
    fs::remove(kEtcNetns, ec);  // only when empty: another user's folders stay
    made_etc_netns_ = false;
  }
}

void NetworkHosts::RemoveStaleLeftovers() {
  // Namespaces of dead test processes.
  if (absl::StatusOr<std::string> list = Ip({"netns", "list"}); list.ok()) {
    for (absl::string_view line : absl::StrSplit(*list, '\n', absl::SkipEmpty())) {
      const std::string ns(line.substr(0, line.find(' ')));
      const int pid = PidInName(ns, "est");
      if (pid <= 0 || pid == pid_ || !ProcessGone(pid)) continue;
      ESTUARY_LOG(INFO) << "NetworkHosts: removing namespace " << ns << " of a dead test";
      KillAllInNamespace(ns);
      (void)Ip({"netns", "del", ns});
    }
  }
  // Root-namespace legs of dead tests.
  if (absl::StatusOr<std::string> links = Ip({"-o", "link", "show"}); links.ok()) {
    for (absl::string_view line : absl::StrSplit(*links, '\n', absl::SkipEmpty())) {
      // "7: esh123@if6: <...>"
      std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 2) continue;
      const std::string name(fields[1].substr(0, fields[1].find_first_of("@:")));
      const int pid = PidInName(name, "esh");
      if (pid <= 0 || pid == pid_ || !ProcessGone(pid)) continue;
      (void)Ip({"link", "del", name});
    }
  }
  // Their /etc/netns folders.
  std::error_code ec;
  if (fs::is_directory(kEtcNetns, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(kEtcNetns, ec)) {
      const std::string name = entry.path().filename().string();
      const int pid = PidInName(name, "est");
      if (pid <= 0 || pid == pid_ || !ProcessGone(pid)) continue;
      fs::remove_all(entry.path(), ec);
    }
  }
}

}  // namespace estuary::testing
