#include "router/generation_defaults.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace estuary::router {
namespace {

// A number field of the file, or nullopt when absent or null; an error naming it otherwise.
absl::StatusOr<std::optional<double>> NumberField(const nlohmann::json& config, const char* name,
                                                  double lo, double hi) {
  auto it = config.find(name);
  if (it == config.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation_config.json: ", name, " must be a number"));
  }
  const double value = it->get<double>();
  if (!(value >= lo && value <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat("generation_config.json: ", name, " = ", value,
                                                   " must be in [", lo, ", ", hi, "]"));
  }
  return std::optional<double>(value);
}

}  // namespace

absl::StatusOr<GenerationDefaults> ParseGenerationConfig(const std::string& json_text) {
  nlohmann::json config = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("generation_config.json is not a JSON object");
  }
  GenerationDefaults defaults;
  ESTUARY_ASSIGN_OR_RETURN(const std::optional<double> temperature,
                           NumberField(config, "temperature", 0, 100));
  ESTUARY_ASSIGN_OR_RETURN(const std::optional<double> top_p, NumberField(config, "top_p", 0, 1));
  ESTUARY_ASSIGN_OR_RETURN(const std::optional<double> top_k,
                           NumberField(config, "top_k", 0, 1 << 30));
  ESTUARY_ASSIGN_OR_RETURN(const std::optional<double> min_p, NumberField(config, "min_p", 0, 1));
  ESTUARY_ASSIGN_OR_RETURN(const std::optional<double> repetition,
                           NumberField(config, "repetition_penalty", 0, 10));
  if (temperature) defaults.temperature = static_cast<float>(*temperature);
  // A top_p of 0 means "off" on our wire, as 1 does.
  if (top_p && *top_p > 0) defaults.top_p = static_cast<float>(*top_p);
  if (top_k) defaults.top_k = static_cast<int>(*top_k);
  if (min_p) defaults.min_p = static_cast<float>(*min_p);
  if (repetition && *repetition > 0) defaults.repetition_penalty = static_cast<float>(*repetition);
  defaults.source = absl::StrCat("generation_config.json (temperature ", defaults.temperature, ")");
  return defaults;
}

absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& model) {
  std::error_code ec;
  if (model.empty() || !std::filesystem::is_directory(model, ec)) return GenerationDefaults{};
  const std::filesystem::path path = std::filesystem::path(model) / "generation_config.json";
  if (!std::filesystem::exists(path, ec)) return GenerationDefaults{};
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<GenerationDefaults> defaults = ParseGenerationConfig(text.str());
  if (!defaults.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", defaults.status().message()));
  }
  return defaults;
}

void ApplyGenerationDefaults(const GenerationDefaults& defaults,
                             estuary::v1::SamplingParams& sampling) {
  if (!sampling.has_temperature()) sampling.set_temperature(defaults.temperature);
  if (sampling.top_p() == 0.0f && defaults.top_p) sampling.set_top_p(*defaults.top_p);
  if (sampling.top_k() == 0 && defaults.top_k) sampling.set_top_k(*defaults.top_k);
  if (sampling.min_p() == 0.0f && defaults.min_p) sampling.set_min_p(*defaults.min_p);
  if (sampling.repetition_penalty() == 0.0f && defaults.repetition_penalty) {
    sampling.set_repetition_penalty(*defaults.repetition_penalty);
  }
  if (!sampling.has_seed()) {
    thread_local absl::BitGen random;
    sampling.set_seed(absl::Uniform<uint64_t>(random));
  }
}

}  // namespace estuary::router
