// server/metrics/registry.cpp: counters, gauges, histograms and the 0.0.4 text exposition.
#include "server/metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <regex>

#include "common/error.h"

namespace tessera::metrics {

void Counter::inc(double amount) {
  if (!(amount >= 0.0)) return;  // also drops NaN
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(const std::vector<double>& upper_bounds)
    : upper_bounds_(upper_bounds), bucket_counts_(new std::atomic<uint64_t>[upper_bounds.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) bucket_counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double value) {
  // Buckets are few (tens); a linear scan beats a binary search's branches at this size.
  size_t i = 0;
  while (i < upper_bounds_.size() && value > upper_bounds_[i]) ++i;
  bucket_counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = upper_bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += bucket_counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  // _count is the +Inf bucket, so a scrape is always self-consistent even mid-update.
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

template <typename Child>
Family<Child>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                      std::vector<double> buckets)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)), buckets_(std::move(buckets)) {}

template <typename Child>
Child& Family<Child>::labels(const LabelValues& values) {
  TESSERA_CHECK(values.size() == label_names_.size(), "metric " << name_ << ": expected " << label_names_.size()
                                                                 << " label values, got " << values.size());
  {
    std::shared_lock lock(mutex_);
    auto it = children_.find(values);
    if (it != children_.end()) return *it->second;
  }
  std::unique_lock lock(mutex_);
  auto it = children_.find(values);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<Child> child;
  if constexpr (std::is_same_v<Child, Histogram>) {
    child = std::make_unique<Histogram>(buckets_);
  } else {
    child = std::make_unique<Child>();
  }
  Child& ref = *child;
  children_.emplace(values, std::move(child));
  return ref;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

namespace {

bool valid_metric_name(const std::string& name) {
  static const std::regex re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  return std::regex_match(name, re);
}
bool valid_label_name(const std::string& name) {
  static const std::regex re("[a-zA-Z_][a-zA-Z0-9_]*");
  return std::regex_match(name, re) && name.rfind("__", 0) != 0;
}

void append_labels(std::string& out, const std::vector<std::string>& names, const LabelValues& values,
                   const char* extra_name = nullptr, const std::string& extra_value = "") {
  if (names.empty() && !extra_name) return;
  out += '{';
  bool first = true;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!first) out += ',';
    first = false;
    out += names[i];
    out += "=\"";
    out += escape_label_value(values[i]);
    out += '"';
  }
  if (extra_name) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += escape_label_value(extra_value);
    out += '"';
  }
  out += '}';
}

void append_header(std::string& out, const std::string& name, const std::string& help, const char* type) {
  out += "# HELP " + name + " " + escape_help(help) + "\n";
  out += "# TYPE " + name + " " + type + "\n";
}

}  // namespace

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Shortest round-trip form; integral values print without a fraction ("3", "1e+21" for huge).
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char ch : value) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '"') out += "\\\"";
    else if (ch == '\n') out += "\\n";
    else out += ch;
  }
  return out;
}

std::string escape_help(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char ch : help) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '\n') out += "\\n";
    else out += ch;
  }
  return out;
}

void Registry::check_new_name(const std::string& name, const std::vector<std::string>& labels) const {
  TESSERA_CHECK(valid_metric_name(name), "metric name '" << name << "' is not a valid Prometheus name");
  for (const std::string& label : labels) {
    TESSERA_CHECK(valid_label_name(label) && label != "le",
                  "metric " << name << ": label name '" << label << "' is not valid");
  }
  for (const Entry& e : entries_) {
    const std::string& existing =
        e.counter ? e.counter->name() : e.gauge ? e.gauge->name() : e.histogram->name();
    TESSERA_CHECK(existing != name, "metric " << name << " is registered twice");
  }
}

Family<Counter>& Registry::counter(const std::string& name, const std::string& help, std::vector<std::string> labels) {
  std::lock_guard lock(mutex_);
  check_new_name(name, labels);
  TESSERA_CHECK(name.size() > 6 && name.ends_with("_total"), "counter " << name << ": name must end in _total");
  Entry e{MetricType::kCounter, std::make_unique<Family<Counter>>(name, help, std::move(labels)), nullptr, nullptr};
  entries_.push_back(std::move(e));
  return *entries_.back().counter;
}

Family<Gauge>& Registry::gauge(const std::string& name, const std::string& help, std::vector<std::string> labels) {
  std::lock_guard lock(mutex_);
  check_new_name(name, labels);
  Entry e{MetricType::kGauge, nullptr, std::make_unique<Family<Gauge>>(name, help, std::move(labels)), nullptr};
  entries_.push_back(std::move(e));
  return *entries_.back().gauge;
}

Family<Histogram>& Registry::histogram(const std::string& name, const std::string& help, std::vector<double> buckets,
                                       std::vector<std::string> labels) {
  std::lock_guard lock(mutex_);
  check_new_name(name, labels);
  TESSERA_CHECK(!buckets.empty() && std::is_sorted(buckets.begin(), buckets.end()) &&
                    std::adjacent_find(buckets.begin(), buckets.end()) == buckets.end() &&
                    std::all_of(buckets.begin(), buckets.end(), [](double b) { return std::isfinite(b); }),
                "histogram " << name << ": buckets must be finite and strictly increasing");
  Entry e{MetricType::kHistogram, nullptr, nullptr,
          std::make_unique<Family<Histogram>>(name, help, std::move(labels), std::move(buckets))};
  entries_.push_back(std::move(e));
  return *entries_.back().histogram;
}

std::string Registry::expose() const {
  std::lock_guard lock(mutex_);
  std::string out;
  out.reserve(8192);
  for (const Entry& e : entries_) {
    switch (e.type) {
      case MetricType::kCounter: {
        // 0.0.4 names the family as its samples (`x_total`), as Prometheus' own client libraries do.
        const Family<Counter>& f = *e.counter;
        append_header(out, f.name(), f.help(), "counter");
        f.for_each([&](const LabelValues& values, const Counter& c) {
          out += f.name();
          append_labels(out, f.label_names(), values);
          out += ' ' + format_value(c.value()) + '\n';
        });
        break;
      }
      case MetricType::kGauge: {
        const Family<Gauge>& f = *e.gauge;
        append_header(out, f.name(), f.help(), "gauge");
        f.for_each([&](const LabelValues& values, const Gauge& g) {
          out += f.name();
          append_labels(out, f.label_names(), values);
          out += ' ' + format_value(g.value()) + '\n';
        });
        break;
      }
      case MetricType::kHistogram: {
        const Family<Histogram>& f = *e.histogram;
        append_header(out, f.name(), f.help(), "histogram");
        f.for_each([&](const LabelValues& values, const Histogram& h) {
          const Histogram::Snapshot s = h.snapshot();
          for (size_t i = 0; i <= s.upper_bounds.size(); ++i) {
            out += f.name() + "_bucket";
            append_labels(out, f.label_names(), values, "le",
                          i < s.upper_bounds.size() ? format_value(s.upper_bounds[i]) : std::string("+Inf"));
            out += ' ' + std::to_string(s.cumulative[i]) + '\n';
          }
          out += f.name() + "_sum";
          append_labels(out, f.label_names(), values);
          out += ' ' + format_value(s.sum) + '\n';
          out += f.name() + "_count";
          append_labels(out, f.label_names(), values);
          out += ' ' + std::to_string(s.count) + '\n';
        });
        break;
      }
    }
  }
  return out;
}

}  // namespace tessera::metrics
