#include "tests/testing/health_check.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace estuary::testing {

absl::StatusOr<HealthStatus> CheckHealth(const std::string& address, const std::string& service,
                                         absl::Duration timeout) {
  auto stub = ::grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ::grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  ::grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("health check of '", service, "' at ", address, ": ",
                                     status.error_message()));
  }
  return response.status();
}

absl::StatusOr<absl::Duration> WaitForHealth(const std::string& address, const std::string& service,
                                             HealthStatus want, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  std::string last = "no answer";
  while (absl::Now() - start < timeout) {
    absl::StatusOr<HealthStatus> got = CheckHealth(address, service);
    if (got.ok() && *got == want) return absl::Now() - start;
    last = got.ok() ? ::grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*got)
                    : got.status().ToString();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "'", service, "' at ", address, " did not turn ",
      ::grpc::health::v1::HealthCheckResponse::ServingStatus_Name(want), " in ",
      absl::FormatDuration(timeout), "; last answer: ", last));
}

}  // namespace estuary::testing
