#pragma once
// Which address a server tells its peers to dial (its advertised address), when it binds one
// address or a wildcard. Kubernetes pods bind 0.0.0.0 and are reached at their pod IP; a
// process on a plain host is reached at the address of the interface that carries its default
// route. Nothing here assumes loopback.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace estuary::process {

// "0.0.0.0", "::", "[::]" or "" (all addresses).
bool IsWildcardHost(std::string_view host);

// One configured address of this host (getifaddrs): the interface name and the address text.
struct InterfaceAddress {
  std::string interface;
  std::string address;  // "198.18.0.2" or "fe80::1"
  bool loopback = false;
};
absl::StatusOr<std::vector<InterfaceAddress>> LocalAddresses();

// The interface of the IPv4 default route in /proc/net/route text (destination 0, mask 0,
// the lowest metric); nullopt when there is none.
std::optional<std::string> DefaultRouteInterface(std::string_view proc_net_route);

// The address to advertise:
//   - `advertise` when set: an IP address of this host, or a name that resolves to one;
//   - otherwise `bind_host` when it is not a wildcard;
//   - otherwise `pod_ip` ($POD_IP, from the Kubernetes downward API) when set;
//   - otherwise the IPv4 address of the interface that carries the default route.
// INVALID_ARGUMENT naming the flag (or $POD_IP) when the address is not one of this host's, or
// FAILED_PRECONDITION when a wildcard bind leaves nothing to advertise.
absl::StatusOr<std::string> ResolveAdvertiseAddress(const std::string& advertise,
                                                    const std::string& bind_host,
                                                    const std::string& pod_ip);

// The interface that holds `address` (nullopt for a name or an address of no interface).
std::optional<InterfaceAddress> InterfaceOf(const std::string& address);

// "host:port", with brackets around an IPv6 literal.
std::string JoinHostPort(const std::string& host, int port);

}  // namespace estuary::process
