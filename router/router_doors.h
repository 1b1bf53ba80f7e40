#pragma once
// The router's gRPC ports and who may use them (issue 14, item 4):
//   - the client port (--port): estuary.v1.Inference for clients, with the API key
//     (--api-key, rpc/api_key.h) and TLS when --ssl-certfile / --ssl-keyfile are given
//     (rpc/client_tls.h);
//   - worker registration (estuary.v1.WorkerRegistry), which always demands the cluster token
//     when one is configured (rpc/cluster_security.h): with --cluster-port P it has a port of
//     its own with the cluster's credentials (mutual TLS when configured) and leaves the client
//     port; without it, it stays on the client port as before, unless mutual TLS is configured:
//     a worker cannot register over mutual TLS on a port whose TLS is the clients', so then
//     registration needs --cluster-port (workers found with --discover-workers need none).

#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "rpc/client_tls.h"

namespace estuary::router {

struct RouterDoors {
  rpc::ClientPortTls client_tls;  // --ssl-certfile, --ssl-keyfile
  int cluster_port = -1;          // --cluster-port: -1 none, 0 any free port
};

// INVALID_ARGUMENT naming the flag. `cluster_tls`: mutual TLS is configured;
// `discovers_workers`: --discover-workers was given.
absl::Status ValidateRouterDoors(const RouterDoors& doors, bool cluster_tls,
                                 bool discovers_workers);

// Which services each port serves (the cluster port's list is empty when it is not opened).
struct PortServices {
  std::vector<grpc::Service*> client;
  std::vector<grpc::Service*> cluster;
  bool registration_served = true;  // false: mutual TLS without --cluster-port
};
PortServices AssignServices(const RouterDoors& doors, bool cluster_tls, grpc::Service* inference,
                            grpc::Service* registry);

}  // namespace estuary::router
