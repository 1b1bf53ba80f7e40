#include "cli/kernel_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/kernels/cpu/bf16_dot.h"
#include "core/kernels/cpu/kernels.h"

ABSL_FLAG(std::string, bf16_kernel, "fma",
          "bf16 weights at 2+ tokens: fma (f32 products) or dot (activations rounded to bf16, "
          "AVX512-BF16 dot products: faster prefill, greedy tokens may change)");

namespace estuary::cli {

absl::Status ApplyKernelFlags() {
  namespace k = kernels::cpu;
  const std::string bf16 = absl::GetFlag(FLAGS_bf16_kernel);
  if (bf16 == "fma") {
    k::SetBf16BatchPath(k::Bf16BatchPath::kFma);
  } else if (bf16 == "dot") {
    if (!k::Bf16DotAvailable()) {
      return absl::FailedPreconditionError("--bf16-kernel=dot: this CPU has no AVX512-BF16");
    }
    k::SetBf16BatchPath(k::Bf16BatchPath::kDot);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--bf16-kernel=", bf16, ": use fma or dot"));
  }
  return absl::OkStatus();
}

}  // namespace estuary::cli
