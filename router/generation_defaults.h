#pragma once
// The served model's sampling defaults: what a request gets for a field it leaves unset. Read by
// the router (the only place that applies them, before it calls a worker) from the model
// folder's generation_config.json, as vLLM does; a field the file does not set falls back to
// OpenAI's default (temperature 1.0, the filters off). A request without a seed gets a random
// one (same seed, same output stays true; no seed, a fresh sample each time).

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "estuary/v1/inference.pb.h"

namespace estuary::router {

struct GenerationDefaults {
  float temperature = 1.0f;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::string source = "built-in (temperature 1.0)";  // for the start-up log
};

// `model` is the router's --model (a folder, or a llama2.c file: then no generation_config.json).
// INVALID_ARGUMENT for a file that is not JSON or gives a field of the wrong type or range.
absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& model);
absl::StatusOr<GenerationDefaults> ParseGenerationConfig(const std::string& json_text);

// Fills the fields `sampling` leaves at "default" (absent temperature or seed; top_p, top_k,
// min_p, repetition_penalty at 0), drawing a seed from absl's random source.
void ApplyGenerationDefaults(const GenerationDefaults& defaults,
                             estuary::v1::SamplingParams& sampling);

}  // namespace estuary::router
