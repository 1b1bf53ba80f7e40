#include "process/host_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace estuary::process {
namespace {

std::string AddressText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
              sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

std::string Unbracketed(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

bool IsLocal(const std::string& address, const std::vector<InterfaceAddress>& local) {
  for (const InterfaceAddress& a : local) {
    if (a.address == address) return true;
  }
  return false;
}

std::string Describe(const std::vector<InterfaceAddress>& local) {
  std::vector<std::string> parts;
  for (const InterfaceAddress& a : local) parts.push_back(absl::StrCat(a.address, " (", a.interface, ")"));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// The numeric addresses `name` resolves to (getaddrinfo: /etc/hosts, DNS).
std::vector<std::string> Resolve(const std::string& name) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  std::vector<std::string> addresses;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &results) != 0) return addresses;
  for (addrinfo* r = results; r != nullptr; r = r->ai_next) {
    addresses.push_back(AddressText(r->ai_addr));
  }
  freeaddrinfo(results);
  return addresses;
}

// `candidate` (named by `source` in errors) when it is, or resolves to, an address of this host.
absl::StatusOr<std::string> CheckLocal(const std::string& candidate, const std::string& source,
                                       const std::vector<InterfaceAddress>& local) {
  const std::string host = Unbracketed(candidate);
  if (IsLocal(host, local)) return host;
  for (const std::string& resolved : Resolve(host)) {
    if (IsLocal(resolved, local)) return host;  // a name of this host: peers resolve it too
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, " = '", candidate, "' is not an address of this host, so peers could not reach it "
      "there (this host's addresses: ", Describe(local), ")"));
}

}  // namespace

bool IsWildcardHost(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

absl::StatusOr<std::vector<InterfaceAddress>> LocalAddresses() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::vector<InterfaceAddress> addresses;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    addresses.push_back(InterfaceAddress{i->ifa_name, AddressText(i->ifa_addr),
                                         (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  return addresses;
}

std::optional<std::string> DefaultRouteInterface(std::string_view proc_net_route) {
  // Iface Destination Gateway Flags RefCnt Use Metric Mask ... (hex, one route a line).
  std::optional<std::string> best;
  long best_metric = std::numeric_limits<long>::max();
  bool header = true;
  const absl::string_view text(proc_net_route.data(), proc_net_route.size());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (header) {
      header = false;
      continue;
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() < 8) continue;
    if (fields[1] != "00000000" || fields[7] != "00000000") continue;
    const long metric = std::strtol(std::string(fields[6]).c_str(), nullptr, 10);
    if (metric < best_metric) {
      best_metric = metric;
      best = std::string(fields[0]);
    }
  }
  return best;
}

std::optional<InterfaceAddress> InterfaceOf(const std::string& address) {
  absl::StatusOr<std::vector<InterfaceAddress>> local = LocalAddresses();
  if (!local.ok()) return std::nullopt;
  const std::string host = Unbracketed(address);
  for (const InterfaceAddress& a : *local) {
    if (a.address == host) return a;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ResolveAdvertiseAddress(const std::string& advertise,
                                                    const std::string& bind_host,
                                                    const std::string& pod_ip) {
  absl::StatusOr<std::vector<InterfaceAddress>> local = LocalAddresses();
  if (!local.ok()) return local.status();
  if (!advertise.empty()) {
    if (IsWildcardHost(advertise)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise-address = '", advertise, "' is a wildcard; peers need an address to dial"));
    }
    return CheckLocal(advertise, "--advertise-address", *local);
  }
  if (!IsWildcardHost(bind_host)) return CheckLocal(bind_host, "--host", *local);
  if (!pod_ip.empty()) return CheckLocal(pod_ip, "$POD_IP", *local);
  std::ifstream in("/proc/net/route");
  std::stringstream routes;
  routes << in.rdbuf();
  const std::optional<std::string> interface = DefaultRouteInterface(routes.str());
  if (interface.has_value()) {
    for (const InterfaceAddress& a : *local) {
      if (a.interface == *interface && a.address.find(':') == std::string::npos) return a.address;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--host = '", bind_host, "' binds every address and ",
      interface.has_value() ? absl::StrCat("the default-route interface ", *interface,
                                           " has no IPv4 address")
                            : std::string("there is no default route"),
      ", so there is no address to advertise: set --advertise-address (or $POD_IP)"));
}

std::string JoinHostPort(const std::string& host, int port) {
  const std::string bare = Unbracketed(host);
  if (bare.find(':') != std::string::npos) return absl::StrCat("[", bare, "]:", port);
  return absl::StrCat(bare, ":", port);
}

}  // namespace estuary::process
