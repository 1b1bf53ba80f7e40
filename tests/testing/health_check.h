#pragma once
// grpc.health.v1 from the client side, for tests of readiness and liveness: one Check call, and
// a wait until a service reaches a status.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.pb.h"

namespace estuary::testing {

using HealthStatus = ::grpc::health::v1::HealthCheckResponse::ServingStatus;
inline constexpr HealthStatus kServing = ::grpc::health::v1::HealthCheckResponse::SERVING;
inline constexpr HealthStatus kNotServing = ::grpc::health::v1::HealthCheckResponse::NOT_SERVING;

// The status of `service` ("" = the whole server; "liveness") at `address`; the call's error
// (UNAVAILABLE when nothing answers, NOT_FOUND for an unknown service) otherwise.
absl::StatusOr<HealthStatus> CheckHealth(const std::string& address, const std::string& service,
                                         absl::Duration timeout = absl::Seconds(1));

// Polls until `service` answers `want`; how long it took, or DEADLINE_EXCEEDED with the last
// answer after `timeout`.
absl::StatusOr<absl::Duration> WaitForHealth(const std::string& address, const std::string& service,
                                             HealthStatus want, absl::Duration timeout);

}  // namespace estuary::testing
