// API keys: the constant-time compare, the Bearer header, the flag / environment choice and the
// server check's refusal. The gRPC and HTTP ports with a key: tests/cli/api_key_e2e_test.cc.
#include "rpc/api_key.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace estuary::rpc {
namespace {

TEST(ApiKeyTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("secret2", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  // A NUL byte is a byte like any other.
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("a\0b", 3), absl::string_view("a\0c", 3)));
}

TEST(ApiKeyTest, BearerMatchesOnlyTheKey) {
  EXPECT_TRUE(BearerMatches("Bearer k3y", "k3y"));
  EXPECT_TRUE(BearerMatches("bearer k3y", "k3y"));
  EXPECT_TRUE(BearerMatches("BEARER   k3y", "k3y"));
  EXPECT_FALSE(BearerMatches("Bearer k3", "k3y"));
  EXPECT_FALSE(BearerMatches("Bearer k3yy", "k3y"));
  EXPECT_FALSE(BearerMatches("k3y", "k3y"));
  EXPECT_FALSE(BearerMatches("Basic k3y", "k3y"));
  EXPECT_FALSE(BearerMatches("", "k3y"));
  EXPECT_FALSE(BearerMatches("Bearer ", "k3y"));
  EXPECT_TRUE(BearerMatches("", ""));  // no key configured: open
}

TEST(ApiKeyTest, FlagWinsOverTheEnvironment) {
  ::setenv(kApiKeyEnv, "from-env", 1);
  EXPECT_EQ(ApiKeyFromFlagOrEnv(""), "from-env");
  EXPECT_EQ(ApiKeyFromFlagOrEnv("from-flag"), "from-flag");
  ::unsetenv(kApiKeyEnv);
  EXPECT_EQ(ApiKeyFromFlagOrEnv(""), "");
}

TEST(ApiKeyTest, ServerCheckWithoutAContextOrKey) {
  EXPECT_TRUE(CheckApiKey(nullptr, "").ok());
  const grpc::Status refused = CheckApiKey(nullptr, "k");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(refused.error_message().find("authorization: Bearer"), std::string::npos);
}

}  // namespace
}  // namespace estuary::rpc
