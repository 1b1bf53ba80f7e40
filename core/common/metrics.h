#pragma once
// A small thread-safe metrics registry rendered in the Prometheus text exposition format 0.0.4
// (design §9). Metrics are created once (usually into function-local statics) and then updated
// lock-free from any thread:
//
//   static auto& requests = MetricsRegistry::Global().GetCounter(
//       "estuary:request_success_total", "Finished requests.", {{"finished_reason", "eos"}});
//   requests.Increment();
//
// A family is one metric name with one HELP text and type; its series differ by their label set.
// Get* with the same name and labels returns the same object; the objects live as long as the
// registry (the global one: the process).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace estuary::common {

// Label name/value pairs, rendered in this order.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Increment(double n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  // Mirrors a running total kept elsewhere (e.g. a KV pool's own counter): the value becomes
  // `total` unless it is already larger, so the counter never goes down.
  void AdvanceTo(double total) {
    double current = value_.load(std::memory_order_relaxed);
    while (current < total &&
           !value_.compare_exchange_weak(current, total, std::memory_order_relaxed)) {
    }
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double n) { value_.fetch_add(n, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds (sorted and deduplicated here); +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v) { Observe(v, 1); }
  // `count` observations of `v` at once.
  void Observe(double v, uint64_t count);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative), bounds().size() + 1 entries (the last: above every bound).
  std::vector<uint64_t> BucketCounts() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t Count() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The process-wide registry that /metrics serves.
  static MetricsRegistry& Global();

  // A name already registered with another type (or a histogram with other bounds) is a
  // programming error: it is logged and a detached metric (never rendered) is returned.
  Counter& GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const MetricLabels& labels = {});

  // Labels every rendered series carries (first), unless the series has a label of that name:
  // a worker process's model_name, as vLLM labels every series.
  void SetConstantLabels(MetricLabels labels);

  // Every family in registration order, each series in registration order.
  std::string RenderPrometheusText() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    MetricLabels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string name;
    std::string help;
    Type type;
    std::vector<double> bounds;  // histograms
    std::vector<std::unique_ptr<Series>> series;
  };
  // The series for (name, labels), created when new; null on a type/bounds mismatch.
  Series* FindOrAdd(const std::string& name, const std::string& help, Type type,
                    const std::vector<double>& bounds, const MetricLabels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  MetricLabels constant_labels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Series>> detached_ ABSL_GUARDED_BY(mu_);
};

// Helpers for the text format (exposed for tests).
std::string FormatMetricValue(double v);          // shortest round-trip; +Inf, -Inf, NaN
std::string EscapeMetricLabelValue(const std::string& v);  // \\, \", \n

}  // namespace estuary::common
