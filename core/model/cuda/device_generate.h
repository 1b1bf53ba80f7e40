#pragma once
// GenerateOnDevice: greedy generation of one sequence on a DeviceDecoder (prompt as one prefill,
// then one decode step per token). For tests, `estuary generate --device cuda` and the GPU
// benchmark; the serving engines batch many sequences through DeviceDecoder::Step themselves.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/cuda/device_decoder.h"

namespace estuary::cuda {

struct DeviceGeneration {
  std::vector<int32_t> completion_ids;
  std::vector<int> backbone_layers;  // per forward step, the prompt's last token first
};

// Generates exactly `new_tokens` tokens (no EOS check) after `prompt_ids`, with exit threshold
// `exit_threshold` (above 1: never exits). The sequence is released afterwards.
absl::StatusOr<DeviceGeneration> GenerateOnDevice(DeviceDecoder& decoder,
                                                  absl::Span<const int32_t> prompt_ids,
                                                  int new_tokens, float exit_threshold = 2.0f);

}  // namespace estuary::cuda
