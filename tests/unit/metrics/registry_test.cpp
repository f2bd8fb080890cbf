// metrics::Registry: value formatting, escaping, exact 0.0.4 exposition, histograms, concurrency,
// and the output read back by prometheus_client's parser and promtool.
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "server/metrics/registry.h"
#include "tests/unit/metrics/exposition_check.h"

namespace tessera::metrics {
namespace {

TEST(MetricsFormat, Values) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(1), "1");
  EXPECT_EQ(format_value(-3), "-3");
  EXPECT_EQ(format_value(0.5), "0.5");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(1e-5), "1e-05");
  EXPECT_EQ(format_value(123456789012.0), "123456789012");
  EXPECT_EQ(format_value(1e300), "1e+300");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(MetricsFormat, Escaping) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(escape_help("x \\ y\nz \"q\""), "x \\\\ y\\nz \"q\"");  // quotes are literal in HELP
}

TEST(MetricsRegistry, ExactExposition) {
  Registry r;
  auto& c = r.counter("app:requests_total", "Requests.\nSecond \\ line", {"code"});
  c.labels({"200"}).inc();
  c.labels({"200"}).inc(2);
  c.labels({"a\"b"}).inc(0.5);
  c.labels({"200"}).inc(-5);  // counters never go down
  auto& g = r.gauge("app:temperature", "Temp.");
  g.labels({}).set(-1.25);
  auto& h = r.histogram("app:latency_seconds", "Latency.", {0.1, 1}, {"m"});
  h.labels({"x"}).observe(0.05);
  h.labels({"x"}).observe(0.1);  // le is inclusive
  h.labels({"x"}).observe(5);
  const std::string expected =
      "# HELP app:requests_total Requests.\\nSecond \\\\ line\n"
      "# TYPE app:requests_total counter\n"
      "app:requests_total{code=\"200\"} 3\n"
      "app:requests_total{code=\"a\\\"b\"} 0.5\n"
      "# HELP app:temperature Temp.\n"
      "# TYPE app:temperature gauge\n"
      "app:temperature -1.25\n"
      "# HELP app:latency_seconds Latency.\n"
      "# TYPE app:latency_seconds histogram\n"
      "app:latency_seconds_bucket{m=\"x\",le=\"0.1\"} 2\n"
      "app:latency_seconds_bucket{m=\"x\",le=\"1\"} 2\n"
      "app:latency_seconds_bucket{m=\"x\",le=\"+Inf\"} 3\n"
      "app:latency_seconds_sum{m=\"x\"} 5.15\n"
      "app:latency_seconds_count{m=\"x\"} 3\n";
  EXPECT_EQ(r.expose(), expected);
}

TEST(MetricsRegistry, RejectsBadDefinitions) {
  Registry r;
  EXPECT_THROW(r.counter("requests", "no _total"), Error);
  EXPECT_THROW(r.gauge("9lives", "bad name"), Error);
  EXPECT_THROW(r.gauge("ok", "bad label", {"le"}), Error);
  EXPECT_THROW(r.gauge("ok2", "bad label", {"__x"}), Error);
  EXPECT_THROW(r.histogram("h", "unsorted", {1, 0.5}), Error);
  EXPECT_THROW(r.histogram("h2", "empty", {}), Error);
  r.gauge("dup", "first");
  EXPECT_THROW(r.gauge("dup", "second"), Error);
  auto& g = r.gauge("labelled", "x", {"a", "b"});
  EXPECT_THROW(g.labels({"only-one"}), Error);
}

TEST(MetricsRegistry, ConcurrentUpdatesAndLabelCreation) {
  Registry r;
  auto& c = r.counter("hits_total", "Hits.", {"worker"});
  auto& h = r.histogram("sizes", "Sizes.", {1, 10, 100});
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& mine = c.labels({std::to_string(t % 2)});  // two threads share each child
      for (int i = 0; i < kPerThread; ++i) {
        mine.inc();
        h.labels({}).observe(i % 200);
        if (i % 1000 == 0) (void)r.expose();  // scrapes race with updates
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.labels({"0"}).value() + c.labels({"1"}).value(), double(kThreads) * kPerThread);
  const Histogram::Snapshot s = h.labels({}).snapshot();
  EXPECT_EQ(s.count, uint64_t(kThreads) * kPerThread);
  EXPECT_EQ(s.cumulative.back(), s.count);
  EXPECT_EQ(s.cumulative[0], uint64_t(kThreads) * (kPerThread / 200) * 2);  // 0 and 1
}

TEST(MetricsRegistry, ParsedByPrometheusClientAndPromtool) {
  Registry r;
  auto& c = r.counter("tessera:test_requests_total", "Requests \\ with \"quotes\"\nand a newline.", {"reason"});
  c.labels({"line\nbreak"}).inc(3);
  c.labels({"quote\"back\\slash"}).inc(1e-5);
  r.gauge("tessera:test_usage_perc", "Usage.", {"model_name"}).labels({"m"}).set(0.25);
  auto& h = r.histogram("tessera:test_latency_seconds", "Latency.", {0.001, 0.5, 2.5}, {"model_name"});
  h.labels({"m"}).observe(0.2);
  h.labels({"m"}).observe(3);
  const std::string text = r.expose();
  const std::string metrics_path = tessera::testing::write_temp(text, "registry.prom");
  const std::string expected_path = tessera::testing::write_temp(R"({
    "families": {"tessera:test_requests": "counter", "tessera:test_usage_perc": "gauge",
                 "tessera:test_latency_seconds": "histogram"},
    "samples": [
      ["tessera:test_requests_total", {"reason": "line\nbreak"}, 3],
      ["tessera:test_requests_total", {"reason": "quote\"back\\slash"}, 1e-05],
      ["tessera:test_usage_perc", {"model_name": "m"}, 0.25],
      ["tessera:test_latency_seconds_bucket", {"model_name": "m", "le": "0.001"}, 0],
      ["tessera:test_latency_seconds_bucket", {"model_name": "m", "le": "0.5"}, 1],
      ["tessera:test_latency_seconds_bucket", {"model_name": "m", "le": "2.5"}, 1],
      ["tessera:test_latency_seconds_bucket", {"model_name": "m", "le": "+Inf"}, 2],
      ["tessera:test_latency_seconds_sum", {"model_name": "m"}, 3.2],
      ["tessera:test_latency_seconds_count", {"model_name": "m"}, 2]
    ]})",
                                                                 "registry.json");
  const auto parsed = tessera::testing::run_command("python3 " + std::string(TESSERA_SOURCE_DIR) +
                                                    "/tests/unit/metrics/check_exposition.py " + metrics_path + " " +
                                                    expected_path);
  if (parsed.exit_code == 77) {
    GTEST_SKIP() << "prometheus_client is not installed (scripts/setup installs it)";
  }
  EXPECT_EQ(parsed.exit_code, 0) << parsed.output << "\n" << text;
  const auto promtool = tessera::testing::run_command("promtool check metrics < " + metrics_path);
  if (promtool.exit_code == 127) GTEST_SKIP() << "promtool is not installed (Debian package prometheus)";
  EXPECT_TRUE(tessera::testing::promtool_only_colon_findings(promtool)) << promtool.output << "\n" << text;
  std::remove(metrics_path.c_str());
  std::remove(expected_path.c_str());
}

}  // namespace
}  // namespace tessera::metrics
