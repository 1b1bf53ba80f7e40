#pragma once
// The exit river's flags as the commands share them: how to quantize it and when to exit.

#include "core/model/exit_policy.h"
#include "core/model/river.h"
#include "core/quant/int4_matrix.h"

namespace estuary::cli {

struct RiverOptions {
  Int4QuantOptions quant;
  RiverLmHead lm_head = RiverLmHead::kShared;
  ExitPolicy policy;
};

}  // namespace estuary::cli
