#include "rpc/grpc_server.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace estuary::rpc {

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& host, int port,
                                              const std::vector<grpc::Service*>& services) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(absl::StrCat(host, ":", port), grpc::InsecureServerCredentials(),
                           &running.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  }
  running.address = absl::StrCat(host, ":", running.port);
  return running;
}

absl::Status WriteReadyFile(const std::string& path, const std::string& address) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << address << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", temporary));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

void WaitForTerminationSignal() {
  const sigset_t signals = TerminationSignals();
  // Blocked in this thread (BlockTerminationSignals did it for the whole process when called
  // first), then taken synchronously.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  int received = 0;
  sigwait(&signals, &received);
}

}  // namespace estuary::rpc
