#include "router/stage_timeouts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace estuary::router {

absl::Status StageTimeouts::Validate() const {
  const std::pair<const char*, absl::Duration> flags[] = {{"--reserve-timeout", reserve},
                                                          {"--prefill-timeout", prefill},
                                                          {"--first-token-timeout", first_token},
                                                          {"--token-gap-timeout", token_gap},
                                                          {"--abort-timeout", abort}};
  for (const auto& [flag, timeout] : flags) {
    if (timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " = ", absl::FormatDuration(timeout), " must be positive"));
    }
  }
  return absl::OkStatus();
}

absl::Time StageDeadline(absl::Time now, absl::Duration stage, absl::Time client_deadline) {
  return std::min(now + stage, client_deadline);
}

}  // namespace estuary::router
