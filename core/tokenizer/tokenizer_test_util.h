#pragma once
// Helpers shared by the tokenizer tests: paths of the shipped models and their golden cases.

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace estuary {
namespace testing_util {

// models/<name>/<file>, relative to the source tree.
inline std::string ModelPath(const std::string& model, const std::string& file) {
  return std::string(ESTUARY_SOURCE_DIR) + "/models/" + model + "/" + file;
}

struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> completion_ids;
  std::string completion_text;
};

// Reads golden.json; returns no cases (and the test fails on that) when it cannot.
inline std::vector<GoldenCase> ReadGolden(const std::string& model) {
  std::ifstream in(ModelPath(model, "golden.json"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const nlohmann::json root = nlohmann::json::parse(buffer.str(), nullptr, false);
  std::vector<GoldenCase> cases;
  if (!root.is_object() || !root.contains("cases") || !root["cases"].is_array()) return cases;
  for (const nlohmann::json& c : root["cases"]) {
    GoldenCase golden;
    golden.prompt = c.value("prompt", "");
    golden.completion_text = c.value("completion_text", "");
    for (const auto& id : c["prompt_ids"]) golden.prompt_ids.push_back(id.get<int32_t>());
    for (const auto& id : c["completion_ids"]) golden.completion_ids.push_back(id.get<int32_t>());
    cases.push_back(std::move(golden));
  }
  return cases;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace testing_util
}  // namespace estuary
