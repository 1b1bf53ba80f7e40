#include "router/request_ids.h"

#include "core/common/secure_random.h"

namespace estuary::router {

std::string NewUnguessableRequestId() { return "req-" + SecureRandomHex(16); }

}  // namespace estuary::router
