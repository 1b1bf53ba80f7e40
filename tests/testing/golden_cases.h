#pragma once
// The golden greedy outputs shipped with the tiny models (models/<model>/golden.json),
// for tests that compare against them. Paths are relative to the repository root, which is the
// tests' working directory.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace estuary::testing {

struct GoldenCase {
  std::string model;  // folder name under models/
  int index = 0;
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> completion_ids;  // greedy, at most kGoldenMaxNewTokens
  std::string completion_text;
};

inline constexpr int kGoldenMaxNewTokens = 200;
// The two shipped models.
inline const std::vector<std::string>& GoldenModels() {
  static const auto* models = new std::vector<std::string>{"stories260K", "stories12L"};
  return *models;
}

std::string GoldenModelDir(const std::string& model);
// Every case of `model`; empty when the file is missing or malformed (tests assert non-empty).
std::vector<GoldenCase> LoadGoldenCases(const std::string& model);
// Every case of every shipped model.
std::vector<GoldenCase> AllGoldenCases();
// The non-empty lines of `model`'s prompts.txt (eval prompts); empty when the file is missing.
std::vector<std::string> LoadEvalPrompts(const std::string& model);

// Short names in test output instead of gtest's byte dump.
inline void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.model << " case " << c.index; }

}  // namespace estuary::testing
