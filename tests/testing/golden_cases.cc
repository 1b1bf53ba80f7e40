#include "tests/testing/golden_cases.h"

#include <cstdlib>
#include <fstream>

#include "nlohmann/json.hpp"

namespace estuary::testing {

std::vector<std::string> LoadEvalPrompts(const std::string& model) {
  std::ifstream in(GoldenModelDir(model) + "/prompts.txt");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

std::string GoldenModelDir(const std::string& model) {
  // ESTUARY_MODELS_DIR points elsewhere (another copy of the models, e.g. a GPU bundle's).
  if (const char* dir = std::getenv("ESTUARY_MODELS_DIR"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/" + model;
  }
  // Both shipped models live in the repository (models/), so a clean clone without ../shared
  // runs every test.
  return "models/" + model;
}

std::vector<GoldenCase> LoadGoldenCases(const std::string& model) {
  std::ifstream in(GoldenModelDir(model) + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<GoldenCase> cases;
  if (!golden.is_object() || !golden.contains("cases")) return cases;
  int index = 0;
  for (const auto& c : golden["cases"]) {
    cases.push_back({model, index++, c["prompt"].get<std::string>(),
                     c["prompt_ids"].get<std::vector<int32_t>>(),
                     c["completion_ids"].get<std::vector<int32_t>>(),
                     c.value("completion_text", std::string())});
  }
  return cases;
}

std::vector<GoldenCase> AllGoldenCases() {
  std::vector<GoldenCase> all;
  for (const std::string& model : GoldenModels()) {
    for (GoldenCase& c : LoadGoldenCases(model)) all.push_back(std::move(c));
  }
  return all;
}

}  // namespace estuary::testing
