#include "rpc/grpc_server.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "rpc/channels.h"
#include "rpc/cluster_security.h"
#include "rpc/parse_status_interceptor.h"

namespace estuary::rpc {

ServingHealth::ServingHealth(grpc::Server* server, std::vector<std::string> services)
    : health_(server->GetHealthCheckService()), services_(std::move(services)) {
  if (health_ == nullptr) return;
  health_->SetServingStatus(kLivenessService, true);
  SetReady(false);
}

void ServingHealth::SetReady(bool ready) {
  ready_ = ready;
  if (health_ == nullptr) return;
  health_->SetServingStatus("", ready);
  for (const std::string& service : services_) health_->SetServingStatus(service, ready);
}

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& host, int port,
                                              const std::vector<grpc::Service*>& services,
                                              const ServerLimits& limits,
                                              std::shared_ptr<grpc::ServerCredentials> credentials) {
  if (limits.max_message_bytes < 1 || limits.max_threads < 1 ||
      limits.max_streams_per_connection < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server limits must be >= 1: max_message_bytes ", limits.max_message_bytes,
        ", max_threads ", limits.max_threads, ", max_streams_per_connection ",
        limits.max_streams_per_connection));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer running;
  if (credentials == nullptr) credentials = ClusterServerCredentials();
  builder.AddListeningPort(absl::StrCat(host, ":", port), std::move(credentials), &running.port);
  ApplyServerKeepalive(builder);
  builder.SetMaxReceiveMessageSize(limits.max_message_bytes);
  builder.SetMaxSendMessageSize(limits.max_message_bytes);
  grpc::ResourceQuota quota("estuary-server");
  quota.SetMaxThreads(limits.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_streams_per_connection);
  for (grpc::Service* service : services) builder.RegisterService(service);
  // A request that does not parse is answered INVALID_ARGUMENT, naming the method.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<ParseStatusInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  }
  running.address = absl::StrCat(host, ":", running.port);
  running.health = ServingHealth(running.server.get(), {});
  return running;
}

}  // namespace estuary::rpc
