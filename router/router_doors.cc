#include "router/router_doors.h"

#include "absl/strings/str_cat.h"

namespace estuary::router {

absl::Status ValidateRouterDoors(const RouterDoors& doors, bool cluster_tls,
                                 bool discovers_workers) {
  if (doors.cluster_port < -1 || doors.cluster_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster-port = ", doors.cluster_port, " outside [-1, 65535]"));
  }
  if (cluster_tls && doors.cluster_port < 0 && !discovers_workers) {
    return absl::InvalidArgumentError(
        "with mutual TLS (--cluster-ca-file) workers register on a port of their own: give "
        "--cluster-port (and point the workers' --router at it), or find them with "
        "--discover-workers");
  }
  return rpc::CheckClientPortTls(doors.client_tls);
}

PortServices AssignServices(const RouterDoors& doors, bool cluster_tls, grpc::Service* inference,
                            grpc::Service* registry) {
  PortServices ports;
  ports.client.push_back(inference);
  if (doors.cluster_port >= 0) {
    ports.cluster.push_back(registry);
  } else if (!cluster_tls) {
    ports.client.push_back(registry);
  } else {
    ports.registration_served = false;
  }
  return ports;
}

}  // namespace estuary::router
