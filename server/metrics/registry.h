// server/metrics/registry.h: an in-house Prometheus registry (counters, gauges, histograms with
// labels) and its text exposition, format 0.0.4.
//
// Thread safety: everything is safe from any thread. Updating a child (inc/set/observe) is a few
// relaxed atomics; only creating a new label set takes a family's mutex (looking one up takes it
// shared), so hot paths keep the child reference they got once.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

namespace tessera::metrics {

using LabelValues = std::vector<std::string>;

class Counter {
 public:
  void inc(double amount = 1.0);  // amount >= 0; negative amounts are ignored (counters only rise)
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>& upper_bounds);  // sorted, finite; +Inf is implied
  void observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;       // without +Inf
    std::vector<uint64_t> cumulative;       // one per bound, then +Inf (== count)
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> bucket_counts_;  // per bucket (not cumulative), +Inf last
  std::atomic<double> sum_{0.0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// A metric name and its label names; children are created per label-value set.
template <typename Child>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> buckets = {});
  // The child for these label values (one per label name), created on first use.
  Child& labels(const LabelValues& values);
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Calls fn(values, child) for each child in label order.
  template <typename Fn>
  void for_each(Fn&& fn) const {
    std::shared_lock lock(mutex_);
    for (const auto& [values, child] : children_) fn(values, *child);
  }

 private:
  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
  std::vector<double> buckets_;
  mutable std::shared_mutex mutex_;
  std::map<LabelValues, std::unique_ptr<Child>> children_;
};

class Registry {
 public:
  // Names match [a-zA-Z_:][a-zA-Z0-9_:]*; a counter's name ends in "_total" (as exposed). Throws
  // tessera::Error on a bad or duplicate name.
  Family<Counter>& counter(const std::string& name, const std::string& help, std::vector<std::string> labels = {});
  Family<Gauge>& gauge(const std::string& name, const std::string& help, std::vector<std::string> labels = {});
  Family<Histogram>& histogram(const std::string& name, const std::string& help, std::vector<double> buckets,
                               std::vector<std::string> labels = {});

  // Text format 0.0.4 (Content-Type: text/plain; version=0.0.4; charset=utf-8).
  std::string expose() const;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Entry {
    MetricType type;
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
  };
  void check_new_name(const std::string& name, const std::vector<std::string>& labels) const;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;  // in registration order
};

// Exposition helpers (exposed for tests).
std::string format_value(double value);         // shortest round-trip decimal, +Inf, -Inf, NaN
std::string escape_label_value(const std::string& value);  // \ " and newline
std::string escape_help(const std::string& help);          // \ and newline

}  // namespace tessera::metrics
