#pragma once
// The ids the router gives requests that bring none (GenerateRequest.request_id empty). An id is
// echoed to its client and names the request in an Abort, so it must not be guessable: 128 bits
// from the kernel's CSPRNG (core/common/secure_random.h), as "req-" and 32 lower-case hex
// digits. Abort also checks that the caller is the one that made the request
// (router_service.cc, rpc/caller_identity.h).

#include <string>

namespace estuary::router {

std::string NewUnguessableRequestId();

}  // namespace estuary::router
