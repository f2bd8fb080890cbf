// ServerMetrics (prometheus-cpp): vLLM's names under `tessera:` or `vllm:`, fed through
// EngineObserver, read back by the prometheus_client parser and promtool.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "server/metrics/server_metrics.h"
#include "tests/unit/metrics/exposition_check.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

GenerateRequest request_for(const std::string& model) {
  GenerateRequest r;
  r.model = model;
  r.request_id = "req-1";
  return r;
}

TEST(ServerMetrics, ExposesVllmNames) {
  ServerMetrics m(ServerInfo{"0.1.0", "lm,emb", "cpu", ""}, {"lm", "emb"});
  const std::string text = m.expose();
  for (const char* name :
       {"tessera:num_requests_running", "tessera:num_requests_waiting", "tessera:kv_cache_usage_perc",
        "tessera:time_to_first_token_seconds", "tessera:inter_token_latency_seconds",
        "tessera:e2e_request_latency_seconds", "tessera:request_queue_time_seconds", "tessera:request_prompt_tokens",
        "tessera:request_generation_tokens", "tessera:prompt_tokens_total", "tessera:generation_tokens_total",
        "tessera:request_success_total", "tessera:request_failure_total", "tessera:num_preemptions_total",
        "tessera:requests_by_attention_policy_total", "tessera:server_info", "tessera:prefix_cache_queries_total",
        "tessera:prefix_cache_hits_total"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + name + " ")) << name;
  }
  EXPECT_THAT(text, HasSubstr("tessera:server_info{backend=\"cpu\",model=\"lm,emb\",profile=\"\",version=\"0.1.0\"} 1\n"));
  // Series exist at zero before the first request, so rate() and dashboards see them.
  EXPECT_THAT(text, HasSubstr("tessera:request_success_total{finished_reason=\"stop\",model_name=\"lm\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("tessera:request_success_total{finished_reason=\"length\",model_name=\"emb\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("tessera:num_requests_running{model_name=\"lm\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("tessera:prefix_cache_hits_total{model_name=\"lm\"} 0\n"));
}

TEST(ServerMetrics, TheVllmPrefixNamesEverySeriesAsVllmDoes) {
  ServerInfo info{"0.1.0", "lm", "cuda", ""};
  info.metric_prefix = "vllm";
  ServerMetrics m(info, {"lm"});
  m.set_cache_info(CacheInfo{16, 1024, "bfloat16", true});
  m.on_prefix_cache_query(1025, 992);
  const std::string text = m.expose();
  EXPECT_THAT(text, HasSubstr("vllm:prefix_cache_queries_total{model_name=\"lm\"} 1025\n"));
  EXPECT_THAT(text, HasSubstr("vllm:prefix_cache_hits_total{model_name=\"lm\"} 992\n"));
  EXPECT_THAT(text, HasSubstr("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"bfloat16\","
                              "enable_prefix_caching=\"True\",num_gpu_blocks=\"1024\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:time_to_first_token_seconds histogram"));
  EXPECT_EQ(text.find("tessera:"), std::string::npos) << "a series kept the tessera: prefix";
  info.metric_prefix = "other";
  EXPECT_THROW(ServerMetrics(info, {"lm"}), Error);
}

TEST(ServerMetrics, ObserverFeedsTheSeries) {
  ServerMetrics m(ServerInfo{"0.1.0", "lm", "cpu", ""}, {"lm"});
  const GenerateRequest r = request_for("lm");
  m.on_step(2, 3, 0.5);
  m.on_request_started(r, 0.25, "sliding_window");
  m.on_first_token(r, 0.03);
  m.on_token_interval(0.02);
  m.on_token_interval(0.04);
  m.on_request_finished(r, RequestFinishReason::kLength, 7, 3, 1.2);
  m.on_request_finished(r, RequestFinishReason::kStop, 5, 1, 0.4);
  m.on_request_finished(r, RequestFinishReason::kCancelled, 5, 1, 0.4);
  m.on_request_finished(r, RequestFinishReason::kDeadline, 5, 0, 9.0);
  m.on_preemption();
  m.on_prefix_cache_query(40, 32);
  m.set_cache_info(CacheInfo{16, 512, "float32", true});
  m.on_rejected("lm", "queue_full");
  m.on_embedding("lm", 4, 0.01);

  const std::string text = m.expose();
  const std::string metrics_path = tessera::testing::write_temp(text, "server.prom");
  const std::string expected_path = tessera::testing::write_temp(R"({
    "families": {"tessera:num_requests_running": "gauge", "tessera:kv_cache_usage_perc": "gauge",
                 "tessera:time_to_first_token_seconds": "histogram", "tessera:prompt_tokens": "counter",
                 "tessera:request_success": "counter", "tessera:request_failure": "counter",
                 "tessera:num_preemptions": "counter", "tessera:requests_by_attention_policy": "counter",
                 "tessera:server_info": "gauge", "tessera:request_prompt_tokens": "histogram"},
    "samples": [
      ["tessera:num_requests_running", {"model_name": "lm"}, 2],
      ["tessera:num_requests_waiting", {"model_name": "lm"}, 3],
      ["tessera:kv_cache_usage_perc", {"model_name": "lm"}, 0.5],
      ["tessera:request_queue_time_seconds_count", {"model_name": "lm"}, 1],
      ["tessera:request_queue_time_seconds_sum", {"model_name": "lm"}, 0.25],
      ["tessera:time_to_first_token_seconds_bucket", {"model_name": "lm", "le": "0.04"}, 1],
      ["tessera:time_to_first_token_seconds_bucket", {"model_name": "lm", "le": "0.02"}, 0],
      ["tessera:inter_token_latency_seconds_count", {"model_name": "lm"}, 2],
      ["tessera:e2e_request_latency_seconds_count", {"model_name": "lm"}, 3],
      ["tessera:prompt_tokens_total", {"model_name": "lm"}, 26],
      ["tessera:generation_tokens_total", {"model_name": "lm"}, 5],
      ["tessera:request_prompt_tokens_bucket", {"model_name": "lm", "le": "5"}, 2],
      ["tessera:request_prompt_tokens_bucket", {"model_name": "lm", "le": "+Inf"}, 3],
      ["tessera:request_success_total", {"finished_reason": "length", "model_name": "lm"}, 1],
      ["tessera:request_success_total", {"finished_reason": "stop", "model_name": "lm"}, 2],
      ["tessera:request_failure_total", {"reason": "cancelled", "model_name": "lm"}, 1],
      ["tessera:request_failure_total", {"reason": "deadline", "model_name": "lm"}, 1],
      ["tessera:request_failure_total", {"reason": "queue_full", "model_name": "lm"}, 1],
      ["tessera:num_preemptions_total", {"model_name": "lm"}, 1],
      ["tessera:prefix_cache_queries_total", {"model_name": "lm"}, 40],
      ["tessera:prefix_cache_hits_total", {"model_name": "lm"}, 32],
      ["tessera:cache_config_info", {"block_size": "16", "cache_dtype": "float32", "enable_prefix_caching": "True",
                                     "num_gpu_blocks": "512"}, 1],
      ["tessera:requests_by_attention_policy_total", {"policy": "sliding_window", "model_name": "lm"}, 1],
      ["tessera:server_info", {"backend": "cpu", "model": "lm", "profile": "", "version": "0.1.0"}, 1]
    ]})",
                                                                 "server.json");
  const auto parsed = tessera::testing::run_command("python3 " + std::string(TESSERA_SOURCE_DIR) +
                                                    "/tests/unit/metrics/check_exposition.py " + metrics_path + " " +
                                                    expected_path);
  if (parsed.exit_code == 77) GTEST_SKIP() << "prometheus_client is not installed (scripts/setup installs it)";
  EXPECT_EQ(parsed.exit_code, 0) << parsed.output << "\n" << text;
  const auto promtool = tessera::testing::run_command("promtool check metrics < " + metrics_path);
  if (promtool.exit_code == 127) GTEST_SKIP() << "promtool is not installed (Debian package prometheus)";
  EXPECT_TRUE(tessera::testing::promtool_only_colon_findings(promtool)) << promtool.output;
  std::remove(metrics_path.c_str());
  std::remove(expected_path.c_str());
}

}  // namespace
}  // namespace tessera
