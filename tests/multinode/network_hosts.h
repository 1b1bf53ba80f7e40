#pragma once
// NetworkHosts: "nodes" on this one machine for multi-node tests (router, prefill and decode
// workers each on its own host), made of Linux network namespaces.
//
// Topology, for a test process with pid P and a subnet 198.18.K.0/24 (the benchmark range,
// RFC 2544; K is chosen from P, skipping any K that a root-namespace address or route overlaps):
//
//   root namespace (the test)          gateway namespace "estP.gw"         node "estP-<node>"
//   esh<P> 198.18.K.1/24  <--veth-->  esg<P> --+
//                                              bridge esb<P> 198.18.K.254
//                                   esv<P>b<i> --+      <--veth-->  esv<P>n<i> 198.18.K.(i+2)/24
//                                                                    lo up, default via .254
//
// - The bridge lives in the gateway namespace, not in the root one: bridged frames then never
//   pass the root namespace's br_netfilter/iptables FORWARD rules (Docker hosts drop there), and
//   the root namespace gains only one link (esh<P>) and its connected route, nothing else.
// - Every node's default route points at the gateway (198.18.K.254), which never forwards
//   (net.ipv4.ip_forward=0 and IPv6 forwarding off inside it): programs in a node find a
//   default-route interface carrying the node's address (our workers use it when they bind
//   0.0.0.0), while no packet can leave the machine. Nothing routes off the machine.
// - Names carry P, so parallel test processes never clash. Create first removes leftovers of
//   crashed runs (namespaces, esh links and /etc/netns folders whose pid is gone), assuming one
//   PID namespace per network namespace (the usual case).
// - Every command (`ip`) runs without a shell through RunProcess (tests/testing/subprocess.h)
//   with a timeout; a failure is a Status naming the command and its stderr. Sysctls are written
//   from a forked child that joined the namespace (no procps needed).
//
// Ownership: the object owns every namespace, link and /etc/netns/<ns>/ folder it made, and
// removes them when destroyed (also after a failed test), killing (SIGKILL) whatever still runs
// inside each namespace first. Processes started with Command() belong to the caller. One
// NetworkHosts per process at a time (names carry only the pid). Not thread-safe. Needs root.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace estuary::testing {

class NetworkHosts {
 public:
  // `nodes`: distinct names of letters, digits, '_' and '-' (at most 40 characters; at most 252
  // nodes). FAILED_PRECONDITION with the reason when namespaces cannot be made here (not root,
  // no `ip` binary, no /etc/hosts, netns/veth/bridge not permitted or not supported): tests
  // GTEST_SKIP with that message. ALREADY_EXISTS while another NetworkHosts of this process
  // lives. INVALID_ARGUMENT for bad names. INTERNAL for other command failures.
  static absl::StatusOr<std::unique_ptr<NetworkHosts>> Create(
      const std::vector<std::string>& nodes);
  ~NetworkHosts();
  NetworkHosts(const NetworkHosts&) = delete;
  NetworkHosts& operator=(const NetworkHosts&) = delete;

  const std::vector<std::string>& nodes() const { return node_names_; }
  // The node's IPv4 address, e.g. "198.18.37.2". Aborts on an unknown node (a test bug), as do
  // namespace_name, interface_name, Command and KillAllIn.
  const std::string& address(const std::string& node) const;
  // The root namespace's (the test process's) address on the test network, 198.18.K.1.
  const std::string& bridge_address() const { return root_address_; }
  // The gateway's address, 198.18.K.254: every node's default route.
  const std::string& gateway_address() const { return gateway_address_; }
  // The node's network namespace ("est<pid>-<node>") and its interface there ("esv<pid>n<i>").
  const std::string& namespace_name(const std::string& node) const;
  const std::string& interface_name(const std::string& node) const;

  // `argv` prefixed so that it runs inside the node: {"/usr/sbin/ip", "netns", "exec", ns,
  // argv...} (the `ip` path is absolute, as ChildProcess and RunProcess exec without a PATH
  // search; argv[0] itself is looked up in PATH by `ip`). `ip netns exec` execs the program, so
  // a ChildProcess started with this argv has the program's own pid and its signals reach the
  // program (network_hosts_test checks this). The program sees /etc/hosts, /etc/host.conf and
  // /etc/resolv.conf from the node's /etc/netns folder.
  std::vector<std::string> Command(const std::string& node,
                                   const std::vector<std::string>& argv) const;

  // Pulls (up = false) or plugs back (up = true) the node's cable: sets the bridge-side veth end
  // down or up. The node keeps its interface, address and routes (it sees NO-CARRIER, as with a
  // pulled cable); nothing reaches it and nothing it sends leaves, so connections time out
  // rather than being refused. Setting the node side down instead would flush the node's routes.
  // NOT_FOUND for an unknown node; INTERNAL when `ip` fails.
  [[nodiscard]] absl::Status SetLinkUp(const std::string& node, bool up);

  // Name resolution for the test hosts: rewrites /etc/netns/<ns>/hosts of every node (bind-
  // mounted over /etc/hosts inside the node by `ip netns exec`) with "localhost" lines plus
  // `entries` (name, addresses). A name may map to several addresses, as a headless Kubernetes
  // Service does: getaddrinfo then returns all of them, because each node's /etc/host.conf
  // says "multi on" (without it glibc's files backend returns only the first). The file is
  // rewritten in place (same inode), so processes already running see the new entries: the
  // bind mount pins the inode, and a renamed-over file would be seen by new processes only.
  // Readers racing a rewrite may briefly see an empty file. INVALID_ARGUMENT for a name with
  // whitespace or an address that is not IPv4/IPv6; INTERNAL when a file cannot be written.
  [[nodiscard]] absl::Status SetHosts(
      const std::vector<std::pair<std::string, std::vector<std::string>>>& entries);

  // Kills (SIGKILL) every process still running inside the node's namespace (`ip netns pids`),
  // repeating for at most 3 s until none is left, for cleanup after a failed test. Never kills
  // the calling process or anything in its own network namespace. Zombies are the parent's to
  // reap (a ChildProcess reaps its own).
  void KillAllIn(const std::string& node);

 private:
  struct Node {
    std::string name;
    std::string ns;           // the network namespace
    std::string address;      // 198.18.K.(i+2)
    std::string node_link;    // esv<pid>n<i>, inside `ns`
    std::string bridge_link;  // esv<pid>b<i>, inside the gateway namespace, on the bridge
  };

  NetworkHosts(std::string ip_path, int pid);
  // Create's steps; whatever they made is recorded below, so the destructor undoes a half-done
  // Create as well.
  [[nodiscard]] absl::Status Build(const std::vector<std::string>& nodes);
  [[nodiscard]] absl::Status BuildGateway(int subnet);
  [[nodiscard]] absl::Status BuildNode(Node& node);
  [[nodiscard]] absl::Status AddNamespace(const std::string& ns);
  [[nodiscard]] absl::Status WriteNodeFiles(const Node& node);
  void RemoveStaleLeftovers();
  [[nodiscard]] absl::StatusOr<std::string> Ip(const std::vector<std::string>& args) const;
  const Node& FindNode(const std::string& node) const;
  void KillAllInNamespace(const std::string& ns);
  void TearDown();

  std::string ip_path_;
  int pid_;
  std::string prefix_;       // "est<pid>": namespaces and /etc/netns folders
  std::string gateway_ns_;   // "est<pid>.gw"
  std::string root_link_;    // "esh<pid>", in the root namespace
  std::string gateway_link_; // "esg<pid>", its peer on the bridge
  std::string bridge_;       // "esb<pid>", in the gateway namespace
  std::string root_address_;
  std::string gateway_address_;
  bool multi_hosts_ = false;  // /etc/host.conf exists, so "multi on" can be bind-mounted over it
  std::vector<std::string> node_names_;
  std::vector<Node> nodes_;
  // What exists, for the teardown (namespaces in creation order, the gateway first).
  std::vector<std::string> made_namespaces_;
  std::vector<std::string> made_folders_;
  bool made_root_link_ = false;
  bool made_etc_netns_ = false;  // /etc/netns did not exist before
};

}  // namespace estuary::testing
