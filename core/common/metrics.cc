#include "core/common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/common/logging.h"

namespace estuary::common {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  while (!bounds_.empty() && std::isinf(bounds_.back()) && bounds_.back() > 0) bounds_.pop_back();
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v, uint64_t count) {
  if (count == 0) return;
  // First bucket whose upper bound is >= v (Prometheus buckets are "le").
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(count, std::memory_order_relaxed);
  sum_.fetch_add(v * static_cast<double>(count), std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t Histogram::Count() const {
  uint64_t n = 0;
  for (uint64_t c : BucketCounts()) n += c;
  return n;
}

MetricsRegistry& MetricsRegistry::Global() {
  static MetricsRegistry* const registry = new MetricsRegistry();
  return *registry;
}

MetricsRegistry::Series* MetricsRegistry::FindOrAdd(const std::string& name,
                                                    const std::string& help, Type type,
                                                    const std::vector<double>& bounds,
                                                    const MetricLabels& labels) {
  Family* family = nullptr;
  for (auto& f : families_) {
    if (f->name == name) {
      family = f.get();
      break;
    }
  }
  if (family == nullptr) {
    auto f = std::make_unique<Family>();
    f->name = name;
    f->help = help;
    f->type = type;
    if (type == Type::kHistogram) f->bounds = Histogram(bounds).bounds();
    family = f.get();
    families_.push_back(std::move(f));
  } else if (family->type != type ||
             (type == Type::kHistogram && family->bounds != Histogram(bounds).bounds())) {
    ESTUARY_LOG(ERROR) << "metric " << name << " registered again with another type or buckets";
    return nullptr;
  }
  for (auto& s : family->series) {
    if (s->labels == labels) return s.get();
  }
  auto s = std::make_unique<Series>();
  s->labels = labels;
  switch (type) {
    case Type::kCounter: s->counter = std::make_unique<Counter>(); break;
    case Type::kGauge: s->gauge = std::make_unique<Gauge>(); break;
    case Type::kHistogram: s->histogram = std::make_unique<Histogram>(bounds); break;
  }
  family->series.push_back(std::move(s));
  return family->series.back().get();
}

Counter& MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  if (Series* s = FindOrAdd(name, help, Type::kCounter, {}, labels)) return *s->counter;
  detached_.push_back(std::make_unique<Series>());
  detached_.back()->counter = std::make_unique<Counter>();
  return *detached_.back()->counter;
}

Gauge& MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  if (Series* s = FindOrAdd(name, help, Type::kGauge, {}, labels)) return *s->gauge;
  detached_.push_back(std::make_unique<Series>());
  detached_.back()->gauge = std::make_unique<Gauge>();
  return *detached_.back()->gauge;
}

Histogram& MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const std::vector<double>& bounds,
                                         const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  if (Series* s = FindOrAdd(name, help, Type::kHistogram, bounds, labels)) return *s->histogram;
  detached_.push_back(std::make_unique<Series>());
  detached_.back()->histogram = std::make_unique<Histogram>(bounds);
  return *detached_.back()->histogram;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

std::string EscapeMetricLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="x",b="y"}` with an optional extra pair (the `le` of a bucket); empty when no labels.
std::string RenderLabels(const MetricLabels& labels, const char* extra_name = nullptr,
                         const std::string& extra_value = "") {
  if (labels.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ",";
    first = false;
    out += k + "=\"" + EscapeMetricLabelValue(v) + "\"";
  }
  if (extra_name != nullptr) {
    if (!first) out += ",";
    out += std::string(extra_name) + "=\"" + EscapeMetricLabelValue(extra_value) + "\"";
  }
  out += "}";
  return out;
}

}  // namespace

void MetricsRegistry::SetConstantLabels(MetricLabels labels) {
  absl::MutexLock lock(&mu_);
  constant_labels_ = std::move(labels);
}

std::string MetricsRegistry::RenderPrometheusText() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& f : families_) {
    const char* type = f->type == Type::kCounter ? "counter"
                       : f->type == Type::kGauge ? "gauge"
                                                 : "histogram";
    out += "# HELP " + f->name + " " + EscapeHelp(f->help) + "\n";
    out += "# TYPE " + f->name + " " + type + "\n";
    for (const auto& series : f->series) {
      // The process's constant labels first, unless the series sets the same name itself.
      MetricLabels labels = constant_labels_;
      labels.erase(std::remove_if(labels.begin(), labels.end(),
                                  [&](const auto& label) {
                                    for (const auto& own : series->labels) {
                                      if (own.first == label.first) return true;
                                    }
                                    return false;
                                  }),
                   labels.end());
      labels.insert(labels.end(), series->labels.begin(), series->labels.end());
      const Counter* counter = series->counter.get();
      const Gauge* gauge = series->gauge.get();
      const Histogram* histogram = series->histogram.get();
      switch (f->type) {
        case Type::kCounter:
          out += f->name + RenderLabels(labels) + " " + FormatMetricValue(counter->Value()) +
                 "\n";
          break;
        case Type::kGauge:
          out += f->name + RenderLabels(labels) + " " + FormatMetricValue(gauge->Value()) +
                 "\n";
          break;
        case Type::kHistogram: {
          const Histogram& h = *histogram;
          const std::vector<uint64_t> counts = h.BucketCounts();
          uint64_t cumulative = 0;
          for (size_t i = 0; i < counts.size(); ++i) {
            cumulative += counts[i];
            const std::string le =
                i < h.bounds().size() ? FormatMetricValue(h.bounds()[i]) : "+Inf";
            out += f->name + "_bucket" + RenderLabels(labels, "le", le) + " " +
                   std::to_string(cumulative) + "\n";
          }
          out += f->name + "_sum" + RenderLabels(labels) + " " + FormatMetricValue(h.Sum()) +
                 "\n";
          out += f->name + "_count" + RenderLabels(labels) + " " + std::to_string(cumulative) +
                 "\n";
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace estuary::common
