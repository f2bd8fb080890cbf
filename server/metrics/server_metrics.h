// server/metrics/server_metrics.h: Tessera's metrics, named as vLLM's under the prefix `tessera:`
// (so dashboards and the Gateway API Inference Extension's endpoint picker work), fed by the engine
// through EngineObserver and by the front ends for requests they reject.
//
// Thread safety: every call is safe from any thread.
#pragma once

#include <string>
#include <vector>

#include "engine/scheduler/engine_loop.h"
#include "server/metrics/registry.h"

namespace tessera {

struct ServerInfo {
  std::string version;
  std::string model;    // served model names, comma-separated
  std::string backend;  // "cpu", "cuda"
  std::string profile;  // tuner profile path, "" for none
};

class ServerMetrics final : public EngineObserver {
 public:
  // model_names: the served models; their request metric children are created up front.
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

  // A request the front end refused (reason: error_kind_name, e.g. "queue_full").
  void on_rejected(const std::string& model, const std::string& reason);
  // An embeddings request served (counted as a success with finished_reason "stop").
  void on_embedding(const std::string& model, int64_t prompt_tokens, double e2e_seconds);

  metrics::Registry& registry() { return registry_; }
  std::string expose() const { return registry_.expose(); }

 private:
  metrics::Registry registry_;
  metrics::Family<metrics::Gauge>* running_;
  metrics::Family<metrics::Gauge>* waiting_;
  metrics::Family<metrics::Gauge>* kv_usage_;
  metrics::Family<metrics::Histogram>* ttft_;
  metrics::Family<metrics::Histogram>* itl_;
  metrics::Family<metrics::Histogram>* e2e_;
  metrics::Family<metrics::Histogram>* queue_time_;
  metrics::Family<metrics::Histogram>* prompt_hist_;
  metrics::Family<metrics::Histogram>* generation_hist_;
  metrics::Family<metrics::Counter>* prompt_tokens_;
  metrics::Family<metrics::Counter>* generation_tokens_;
  metrics::Family<metrics::Counter>* success_;
  metrics::Family<metrics::Counter>* failure_;
  metrics::Family<metrics::Counter>* preemptions_;
  metrics::Family<metrics::Counter>* prefix_queries_;
  metrics::Family<metrics::Counter>* prefix_hits_;
  metrics::Family<metrics::Counter>* by_policy_;
  std::string engine_model_label_;  // model_name for engine-wide series (the first LLM)
};

}  // namespace tessera
