#pragma once
// Helpers shared by the loader tests.

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace estuary::testing_util {

// A fresh, empty directory for the running test.
inline std::filesystem::path TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "estuary_loader" /
                              (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteAll(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string ModelDir(const char* name) {
  return std::string(ESTUARY_SOURCE_DIR) + "/models/" + name;
}

}  // namespace estuary::testing_util
