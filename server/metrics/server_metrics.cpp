// server/metrics/server_metrics.cpp: vLLM's metric names and buckets under `tessera:`.
#include "server/metrics/server_metrics.h"

namespace tessera {
namespace {

// vLLM's buckets, so that dashboards built for it read the same quantiles.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// 1, 2, 5, 10, 20, 50, ... up to 1M tokens (vLLM's build_1_2_5_buckets).
std::vector<double> token_buckets() {
  std::vector<double> b;
  for (double scale = 1; scale <= 1e6; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) b.push_back(m * scale);
  }
  return b;
}

const char* kFinishedReasons[] = {"stop", "length"};
const char* kFailureReasons[] = {"cancelled", "deadline", "error"};

}  // namespace

ServerMetrics::ServerMetrics(const ServerInfo& info, const std::vector<std::string>& model_names) {
  using metrics::LabelValues;
  const std::vector<std::string> model = {"model_name"};
  running_ = &registry_.gauge("tessera:num_requests_running", "Number of requests in model execution batches.", model);
  waiting_ = &registry_.gauge("tessera:num_requests_waiting", "Number of requests waiting to be processed.", model);
  kv_usage_ = &registry_.gauge("tessera:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", model);
  ttft_ = &registry_.histogram("tessera:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               kTtftBuckets, model);
  itl_ = &registry_.histogram("tessera:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                              kItlBuckets, model);
  e2e_ = &registry_.histogram("tessera:e2e_request_latency_seconds",
                              "Histogram of end to end request latency in seconds.", kLatencyBuckets, model);
  queue_time_ = &registry_.histogram("tessera:request_queue_time_seconds",
                                     "Histogram of time spent in WAITING phase for request.", kLatencyBuckets, model);
  prompt_hist_ = &registry_.histogram("tessera:request_prompt_tokens", "Number of prefill tokens processed.",
                                      token_buckets(), model);
  generation_hist_ = &registry_.histogram("tessera:request_generation_tokens", "Number of generation tokens processed.",
                                          token_buckets(), model);
  prompt_tokens_ = &registry_.counter("tessera:prompt_tokens_total", "Number of prefill tokens processed.", model);
  generation_tokens_ =
      &registry_.counter("tessera:generation_tokens_total", "Number of generation tokens processed.", model);
  success_ = &registry_.counter("tessera:request_success_total", "Count of successfully processed requests.",
                                {"finished_reason", "model_name"});
  failure_ = &registry_.counter("tessera:request_failure_total",
                                "Count of requests that ended in an error, by reason (cancelled, deadline, error, "
                                "or the front end's rejection: invalid_request, queue_full, ...).",
                                {"model_name", "reason"});
  preemptions_ = &registry_.counter("tessera:num_preemptions_total", "Cumulative number of preemption from the engine.",
                                    model);
  prefix_queries_ = &registry_.counter("tessera:prefix_cache_queries_total",
                                      "Prefix cache queries, in terms of number of queried tokens.", model);
  prefix_hits_ = &registry_.counter("tessera:prefix_cache_hits_total",
                                    "Prefix cache hits, in terms of number of cached tokens.", model);
  by_policy_ = &registry_.counter("tessera:requests_by_attention_policy_total",
                                  "Generate requests started, by attention mask policy.", {"model_name", "policy"});
  auto& info_gauge = registry_.gauge("tessera:server_info", "Tessera build and serving information.",
                                     {"backend", "model", "profile", "version"});
  info_gauge.labels({info.backend, info.model, info.profile, info.version}).set(1.0);

  engine_model_label_ = model_names.empty() ? std::string() : model_names.front();
  // Children created up front so that a scrape shows every series at 0 before the first request.
  for (const std::string& name : model_names) {
    const LabelValues m = {name};
    for (auto* f : {ttft_, itl_, e2e_, queue_time_, prompt_hist_, generation_hist_}) f->labels(m);
    prompt_tokens_->labels(m);
    generation_tokens_->labels(m);
    for (const char* r : kFinishedReasons) success_->labels({r, name});
    for (const char* r : kFailureReasons) failure_->labels({name, r});
    by_policy_->labels({name, "causal"});
  }
  const LabelValues engine = {engine_model_label_};
  running_->labels(engine);
  waiting_->labels(engine);
  kv_usage_->labels(engine);
  preemptions_->labels(engine);
  prefix_queries_->labels(engine);
  prefix_hits_->labels(engine);
}

void ServerMetrics::on_step(int32_t running, int32_t waiting, double kv_cache_usage) {
  const metrics::LabelValues engine = {engine_model_label_};
  running_->labels(engine).set(running);
  waiting_->labels(engine).set(waiting);
  kv_usage_->labels(engine).set(kv_cache_usage);
}

void ServerMetrics::on_request_started(const GenerateRequest& request, double queue_seconds, const std::string& policy) {
  queue_time_->labels({request.model}).observe(queue_seconds);
  by_policy_->labels({request.model, policy}).inc();
}

void ServerMetrics::on_first_token(const GenerateRequest& request, double ttft_seconds) {
  ttft_->labels({request.model}).observe(ttft_seconds);
}

void ServerMetrics::on_token_interval(double seconds) { itl_->labels({engine_model_label_}).observe(seconds); }

void ServerMetrics::on_request_finished(const GenerateRequest& request, RequestFinishReason reason,
                                        int64_t prompt_tokens, int64_t completion_tokens, double e2e_seconds) {
  const metrics::LabelValues m = {request.model};
  prompt_tokens_->labels(m).inc(static_cast<double>(prompt_tokens));
  generation_tokens_->labels(m).inc(static_cast<double>(completion_tokens));
  switch (reason) {
    case RequestFinishReason::kStop:
    case RequestFinishReason::kLength:
      success_->labels({finish_reason_name(reason), request.model}).inc();
      e2e_->labels(m).observe(e2e_seconds);
      prompt_hist_->labels(m).observe(static_cast<double>(prompt_tokens));
      generation_hist_->labels(m).observe(static_cast<double>(completion_tokens));
      break;
    case RequestFinishReason::kCancelled:
    case RequestFinishReason::kDeadline:
    case RequestFinishReason::kError:
      failure_->labels({request.model, finish_reason_name(reason)}).inc();
      break;
  }
}

void ServerMetrics::on_preemption() { preemptions_->labels({engine_model_label_}).inc(); }

void ServerMetrics::on_prefix_cache_query(int64_t queried, int64_t hit) {
  prefix_queries_->labels({engine_model_label_}).inc(static_cast<double>(queried));
  prefix_hits_->labels({engine_model_label_}).inc(static_cast<double>(hit));
}

void ServerMetrics::on_rejected(const std::string& model, const std::string& reason) {
  failure_->labels({model, reason}).inc();
}

void ServerMetrics::on_embedding(const std::string& model, int64_t prompt_tokens, double e2e_seconds) {
  const metrics::LabelValues m = {model};
  prompt_tokens_->labels(m).inc(static_cast<double>(prompt_tokens));
  prompt_hist_->labels(m).observe(static_cast<double>(prompt_tokens));
  e2e_->labels(m).observe(e2e_seconds);
  success_->labels({"stop", model}).inc();
}

}  // namespace tessera
