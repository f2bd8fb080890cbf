// server/metrics/server_metrics.h: Tessera's metrics on prometheus-cpp, named as vLLM's under the
// prefix `tessera:` (or `vllm:`, metrics.prefix), so that vLLM dashboards and the Gateway API
// Inference Extension's endpoint picker read them unchanged. Fed by the engine through
// EngineObserver and by the front ends for requests they reject.
//
// Thread safety: every call is safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "engine/scheduler/engine_loop.h"

namespace tessera {

struct ServerInfo {
  std::string version;
  std::string model;    // served model names, comma-separated
  std::string backend;  // "cpu", "cuda"
  std::string profile;  // tuner profile path, "" for none
  std::string metric_prefix = "tessera";  // "tessera" or "vllm": the series are named "<prefix>:..."
  // The active tuner profile's choices, as the labels of the profile_info gauge; empty: no gauge.
  std::vector<std::pair<std::string, std::string>> profile_labels{};
};

// The KV cache as vLLM's cache_config_info gauge labels it.
struct CacheInfo {
  int32_t block_size = 0;
  int64_t num_blocks = 0;   // per served LLM
  std::string cache_dtype;  // "float32", "bfloat16", "float16"
  bool prefix_caching = false;
};

class ServerMetrics final : public EngineObserver {
 public:
  // model_names: the served models; their request series are created up front, at 0.
  // Throws tessera::Error when info.metric_prefix is not "tessera" or "vllm".
  ServerMetrics(const ServerInfo& info, const std::vector<std::string>& model_names);

  // EngineObserver (engine thread).
  void on_step(int32_t running, int32_t waiting, double kv_cache_usage) override;
  void on_request_started(const GenerateRequest& request, double queue_seconds, const std::string& policy) override;
  void on_first_token(const GenerateRequest& request, double ttft_seconds) override;
  void on_token_interval(double seconds) override;
  void on_request_finished(const GenerateRequest& request, RequestFinishReason reason, int64_t prompt_tokens,
                           int64_t completion_tokens, double e2e_seconds) override;
  void on_preemption() override;
  void on_prefix_cache_query(int64_t queried, int64_t hit) override;
  void on_grammar_masks(double seconds) override;
  void on_speculation(int32_t drafted, int32_t accepted) override;

  // Sets cache_config_info (once the engine has sized its KV pools).
  void set_cache_info(const CacheInfo& cache);

  // A request the front end refused (reason: error_kind_name, e.g. "queue_full").
  void on_rejected(const std::string& model, const std::string& reason);
  // An embeddings request served (counted as a success with finished_reason "stop").
  void on_embedding(const std::string& model, int64_t prompt_tokens, double e2e_seconds);

  // A response format or tool-call grammar compiled for `model` (a cache hit included).
  void on_grammar_compile(const std::string& model, double seconds);

  // The engine's heartbeat, set before each scrape: a stalled engine does not step, so a gauge fed
  // by the engine thread would freeze at its last value.
  void set_engine_health(const EngineHealth& health);
  // The engine stopped for good on an error (counted once per occurrence by the serve loop).
  void on_engine_fatal_error();

  // The text exposition format 0.0.4, served at /metrics with kContentType.
  std::string expose() const;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  prometheus::Registry registry_;
  std::string prefix_;  // "tessera:" or "vllm:"
  prometheus::Family<prometheus::Gauge>* running_;
  prometheus::Family<prometheus::Gauge>* waiting_;
  prometheus::Family<prometheus::Gauge>* kv_usage_;
  prometheus::Family<prometheus::Histogram>* ttft_;
  prometheus::Family<prometheus::Histogram>* itl_;
  prometheus::Family<prometheus::Histogram>* e2e_;
  prometheus::Family<prometheus::Histogram>* queue_time_;
  prometheus::Family<prometheus::Histogram>* prompt_hist_;
  prometheus::Family<prometheus::Histogram>* generation_hist_;
  prometheus::Family<prometheus::Counter>* prompt_tokens_;
  prometheus::Family<prometheus::Counter>* generation_tokens_;
  prometheus::Family<prometheus::Counter>* success_;
  prometheus::Family<prometheus::Counter>* failure_;
  prometheus::Family<prometheus::Counter>* preemptions_;
  prometheus::Family<prometheus::Counter>* prefix_queries_;
  prometheus::Family<prometheus::Counter>* prefix_hits_;
  prometheus::Family<prometheus::Counter>* by_policy_;
  prometheus::Family<prometheus::Gauge>* cache_config_;
  prometheus::Family<prometheus::Histogram>* grammar_compile_;
  std::string engine_model_label_;  // model_name for engine-wide series (the first LLM)
  // The engine-wide children, looked up once: on_step and on_token_interval run every step.
  prometheus::Gauge* running_now_;
  prometheus::Gauge* waiting_now_;
  prometheus::Gauge* kv_usage_now_;
  prometheus::Histogram* itl_engine_;
  prometheus::Histogram* grammar_masks_;
  prometheus::Counter* spec_drafts_;
  prometheus::Counter* spec_draft_tokens_;
  prometheus::Counter* spec_accepted_tokens_;
  prometheus::Family<prometheus::Counter>* spec_accepted_per_position_;
  prometheus::Gauge* seconds_since_step_;
  prometheus::Counter* fatal_errors_;
};

}  // namespace tessera
