// Cluster security's start-time checks (rpc/cluster_security.h): what ConfigureClusterSecurity
// refuses, naming the flag, and that a refusal leaves the settings as they were. The ports
// themselves, with real certificates and processes: tests/reliability/security_test.cc.
#include "rpc/cluster_security.h"

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "gtest/gtest.h"

namespace estuary::rpc {
namespace {

namespace fs = std::filesystem;

absl::Status Configure(const std::string& token, ClusterTlsFiles tls = {},
                       absl::Duration refresh = absl::Seconds(60)) {
  return ConfigureClusterSecurity({token, std::move(tls), refresh});
}

bool Mentions(const absl::Status& status, const std::string& text) {
  return status.message().find(text) != absl::string_view::npos;
}

TEST(ClusterSecurityTest, TokensMustBeLongAndPrintable) {
  EXPECT_TRUE(Configure("").ok());
  EXPECT_FALSE(ClusterTokenSet());
  EXPECT_TRUE(Configure("0123456789abcdef").ok());
  EXPECT_TRUE(ClusterTokenSet());
  const absl::Status short_token = Configure("short");
  EXPECT_EQ(short_token.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(short_token, "--cluster-token")) << short_token;
  EXPECT_TRUE(ClusterTokenSet()) << "a refused configuration changed the settings";
  EXPECT_EQ(Configure("0123456789 abcdef").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Configure("0123456789\nabcdef").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Configure("").ok());
}

TEST(ClusterSecurityTest, MutualTlsNeedsThreeReadableMatchingFiles) {
  const fs::path dir = fs::temp_directory_path() / ("cluster-security-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string garbage = (dir / "garbage.pem").string();
  std::ofstream(garbage) << "not a certificate\n";

  absl::Status s = Configure("", {"ca.pem", "", ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "all three")) << s;
  s = Configure("", {(dir / "missing.pem").string(), garbage, garbage});
  EXPECT_TRUE(Mentions(s, "--cluster-ca-file")) << s;
  EXPECT_TRUE(Mentions(s, "cannot read")) << s;
  s = Configure("", {garbage, garbage, garbage});
  EXPECT_TRUE(Mentions(s, "--cluster-ca-file")) << s;
  EXPECT_TRUE(Mentions(s, "no PEM certificate")) << s;
  EXPECT_FALSE(ClusterTlsEnabled());
  EXPECT_EQ(Configure("", {}, absl::Milliseconds(10)).code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(ClusterSecurityTest, TheTokenCheckPassesInProcessCallsAndOpenClusters) {
  ASSERT_TRUE(Configure("").ok());
  EXPECT_TRUE(CheckClusterToken(nullptr).ok());
  EXPECT_TRUE(ClusterInterceptors().empty());
  ASSERT_TRUE(Configure("0123456789abcdef").ok());
  EXPECT_TRUE(CheckClusterToken(nullptr).ok());  // in-process (e.g. a worker's own GetLoad)
  EXPECT_EQ(ClusterInterceptors().size(), 1u);
  ASSERT_TRUE(Configure("").ok());
}

// Keys derived from the token: the same for every process with the token, one per label, none
// without a token, never the token itself.
TEST(ClusterSecurityTest, SubkeysAreDerivedFromTheTokenOnePerLabel) {
  ASSERT_TRUE(Configure("").ok());
  ASSERT_TRUE(ClusterSubkey("estuary kv descriptor v1").ok());
  EXPECT_TRUE(ClusterSubkey("estuary kv descriptor v1")->empty());
  ASSERT_TRUE(Configure("0123456789abcdef").ok());
  const absl::StatusOr<std::string> key = ClusterSubkey("estuary kv descriptor v1");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->size(), 32u);
  EXPECT_EQ(*ClusterSubkey("estuary kv descriptor v1"), *key);  // what another process derives
  EXPECT_NE(*ClusterSubkey("another purpose"), *key);
  EXPECT_EQ(key->find("0123456789abcdef"), std::string::npos);
  ASSERT_TRUE(Configure("0123456789abcdeF").ok());
  EXPECT_NE(*ClusterSubkey("estuary kv descriptor v1"), *key);  // another token, another key
  ASSERT_TRUE(Configure("").ok());
}

}  // namespace
}  // namespace estuary::rpc
