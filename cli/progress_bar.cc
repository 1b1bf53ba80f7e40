#include "cli/progress_bar.h"

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "absl/time/clock.h"
#include "core/common/logging.h"

namespace estuary::cli {

ProgressCallback MakeProgressReporter() {
  struct State {
    bool tty = ::isatty(2) != 0;
    int last_decile = -1;
    absl::Time start = absl::Now();
  };
  auto state = std::make_shared<State>();
  return [state](const LoadProgress& p) {
    if (p.bytes_total <= 0) return;
    const double fraction = static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total);
    // Weights are memory-mapped: "done" means mapped and checked, not read, so no rate is shown.
    const double seconds = absl::ToDoubleSeconds(absl::Now() - state->start);
    if (state->tty) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(fraction * kWidth);
      std::fprintf(stderr, "\rLoading %-12.12s [%.*s%*s] %3d%% %.1f s", p.stage.c_str(), filled,
                   "==============================", kWidth - filled, "",
                   static_cast<int>(fraction * 100), seconds);
      if (p.bytes_done >= p.bytes_total) std::fprintf(stderr, "\n");
      return;
    }
    const int decile = static_cast<int>(fraction * 10);
    if (decile != state->last_decile) {
      state->last_decile = decile;
      ESTUARY_LOG(INFO) << "loading " << p.stage << ": " << decile * 10 << "% ("
                        << p.bytes_done << " of " << p.bytes_total << " bytes, " << seconds
                        << " s)";
    }
  };
}

}  // namespace estuary::cli
