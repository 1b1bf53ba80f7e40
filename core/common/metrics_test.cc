#include "core/common/metrics.h"

#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace estuary::common {
namespace {

TEST(MetricsTest, RendersExactText) {
  MetricsRegistry registry;
  registry.GetCounter("estuary:requests_total", "Requests.", {{"reason", "eos"}}).Increment();
  registry.GetCounter("estuary:requests_total", "Requests.", {{"reason", "a\"b\\c\nd"}})
      .Increment(2);
  registry.GetCounter("estuary:requests_total", "Requests.", {{"reason", "eos"}}).Increment(3);
  registry.GetGauge("estuary:usage", "Usage, with \\ and\nnewline.").Set(0.25);
  Histogram& h = registry.GetHistogram("estuary:latency_seconds", "Latency.", {1, 0.1, 10});
  h.Observe(0.05);
  h.Observe(0.1);  // le is inclusive
  h.Observe(5);
  h.Observe(100);
  EXPECT_EQ(registry.RenderPrometheusText(),
            "# HELP estuary:requests_total Requests.\n"
            "# TYPE estuary:requests_total counter\n"
            "estuary:requests_total{reason=\"eos\"} 4\n"
            "estuary:requests_total{reason=\"a\\\"b\\\\c\\nd\"} 2\n"
            "# HELP estuary:usage Usage, with \\\\ and\\nnewline.\n"
            "# TYPE estuary:usage gauge\n"
            "estuary:usage 0.25\n"
            "# HELP estuary:latency_seconds Latency.\n"
            "# TYPE estuary:latency_seconds histogram\n"
            "estuary:latency_seconds_bucket{le=\"0.1\"} 2\n"
            "estuary:latency_seconds_bucket{le=\"1\"} 2\n"
            "estuary:latency_seconds_bucket{le=\"10\"} 3\n"
            "estuary:latency_seconds_bucket{le=\"+Inf\"} 4\n"
            "estuary:latency_seconds_sum 105.15\n"
            "estuary:latency_seconds_count 4\n");
}

TEST(MetricsTest, LabeledHistogramPutsLeLast) {
  MetricsRegistry registry;
  registry.GetHistogram("h", "H.", {1}, {{"k", "v"}}).Observe(0.5);
  EXPECT_EQ(registry.RenderPrometheusText(),
            "# HELP h H.\n"
            "# TYPE h histogram\n"
            "h_bucket{k=\"v\",le=\"1\"} 1\n"
            "h_bucket{k=\"v\",le=\"+Inf\"} 1\n"
            "h_sum{k=\"v\"} 0.5\n"
            "h_count{k=\"v\"} 1\n");
}

// A worker's model_name: on every series, first, unless the series names it itself.
TEST(MetricsTest, ConstantLabelsGoOnEverySeries) {
  MetricsRegistry r;
  r.GetCounter("c_total", "a counter").Increment(2);
  r.GetGauge("g", "a gauge", {{"model_name", "own"}}).Set(1);
  r.GetHistogram("h", "a histogram", {1.0}, {{"kind", "x"}}).Observe(0.5);
  r.SetConstantLabels({{"model_name", "tiny"}});
  const std::string text = r.RenderPrometheusText();
  EXPECT_NE(text.find("c_total{model_name=\"tiny\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("g{model_name=\"own\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_bucket{model_name=\"tiny\",kind=\"x\",le=\"1\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("h_count{model_name=\"tiny\",kind=\"x\"} 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, SameNameAndLabelsIsTheSameMetric) {
  MetricsRegistry registry;
  Counter& a = registry.GetCounter("c", "C.");
  Counter& b = registry.GetCounter("c", "C.");
  EXPECT_EQ(&a, &b);
  // Another type under the same name: detached, not rendered.
  Gauge& g = registry.GetGauge("c", "C.");
  g.Set(7);
  EXPECT_EQ(registry.RenderPrometheusText(), "# HELP c C.\n# TYPE c counter\nc 0\n");
}

TEST(MetricsTest, FormatsValues) {
  EXPECT_EQ(FormatMetricValue(3), "3");
  EXPECT_EQ(FormatMetricValue(0.001), "0.001");
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
}

TEST(MetricsTest, AdvanceToMirrorsATotalAndNeverGoesDown) {
  Counter c;
  c.AdvanceTo(5);
  EXPECT_EQ(c.Value(), 5);
  c.AdvanceTo(3);  // an older snapshot read late
  EXPECT_EQ(c.Value(), 5);
  c.AdvanceTo(9);
  EXPECT_EQ(c.Value(), 9);
}

TEST(MetricsTest, ConcurrentIncrements) {
  MetricsRegistry registry;
  Counter& c = registry.GetCounter("c", "C.");
  Histogram& h = registry.GetHistogram("h", "H.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        c.Increment();
        h.Observe(2);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.Value(), 4000);
  EXPECT_EQ(h.Count(), 4000u);
  EXPECT_EQ(h.Sum(), 8000);
}

}  // namespace
}  // namespace estuary::common
