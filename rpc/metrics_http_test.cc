#include "rpc/metrics_http.h"

#include "core/common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace estuary::rpc {
namespace {

using ::testing::HasSubstr;

TEST(MetricsHttpServerTest, ServesMetricsAndHealth) {
  common::MetricsRegistry registry;
  registry.GetCounter("estuary:test_total", "A test counter.", {{"k", "v"}}).Increment(3);
  MetricsHttpServer server(&registry);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_GT(server.port(), 0);

  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(res->body, HasSubstr("# TYPE estuary:test_total counter\n"));
  EXPECT_THAT(res->body, HasSubstr("\nestuary:test_total{k=\"v\"} 3\n"));

  // Readiness follows SetReady; liveness does not.
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  server.SetReady(true);
  health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  server.SetReady(false);
  EXPECT_EQ(client.Get("/health")->status, 503);
  auto live = client.Get("/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);

  server.Stop();
  EXPECT_FALSE(client.Get("/health"));
}

TEST(MetricsHttpServerTest, StopsWithoutRequests) {
  MetricsHttpServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  EXPECT_FALSE(server.Start("127.0.0.1", 0).ok());
}

}  // namespace
}  // namespace estuary::rpc
