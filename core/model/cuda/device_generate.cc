#include "core/model/cuda/device_generate.h"

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace estuary::cuda {

absl::StatusOr<DeviceGeneration> GenerateOnDevice(DeviceDecoder& decoder,
                                                  absl::Span<const int32_t> prompt_ids,
                                                  int new_tokens, float exit_threshold) {
  if (prompt_ids.empty()) return absl::InvalidArgumentError("empty prompt");
  if (new_tokens < 1) return absl::InvalidArgumentError("new_tokens must be positive");
  const int64_t end = static_cast<int64_t>(prompt_ids.size()) + new_tokens - 1;
  if (end > decoder.max_seq_len()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt plus ", new_tokens,
                                                   " tokens exceeds the decoder's ",
                                                   decoder.max_seq_len(), " positions"));
  }
  ESTUARY_ASSIGN_OR_RETURN(const int32_t sequence, decoder.AddSequence());
  // The sequence goes back to the pool on every path out.
  struct Release {
    DeviceDecoder& decoder;
    int32_t sequence;
    ~Release() { decoder.ReleaseSequence(sequence); }
  } release{decoder, sequence};

  DeviceGeneration out;
  DeviceRowResult result;
  ESTUARY_RETURN_IF_ERROR(decoder.Prefill(sequence, prompt_ids, 0, exit_threshold, result));
  int position = static_cast<int>(prompt_ids.size());
  while (true) {
    out.completion_ids.push_back(result.next_token);
    out.backbone_layers.push_back(result.backbone_layers);
    if (static_cast<int>(out.completion_ids.size()) == new_tokens) break;
    const DeviceRow row{sequence, result.next_token, position++, exit_threshold};
    ESTUARY_RETURN_IF_ERROR(decoder.Step({&row, 1}, {&result, 1}));
  }
  return out;
}

}  // namespace estuary::cuda
