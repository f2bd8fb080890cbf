// server/metrics/server_metrics.cpp: vLLM's metric names and buckets under `tessera:` (or `vllm:`).
#include "server/metrics/server_metrics.h"

#include <prometheus/text_serializer.h>

#include "common/error.h"

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
std::vector<double> one_two_five_buckets() {
  std::vector<double> b;
  for (double scale = 1; scale <= 1e6; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) b.push_back(m * scale);
  }
  return b;
}

const std::vector<double> kTokenBuckets = one_two_five_buckets();
// Grammar masks take tens of microseconds to a few milliseconds a step.
const std::vector<double> kGrammarMaskBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                 0.005,   0.01,   0.025,   0.05,   0.1};
// A cached grammar returns in microseconds; a large JSON schema compiles in seconds.
const std::vector<double> kCompileBuckets = {0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0};

const char* kFinishedReasons[] = {"stop", "length"};
const char* kFailureReasons[] = {"cancelled", "deadline", "error"};

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

Labels model_label(const std::string& model) { return {{"model_name", model}}; }

}  // namespace

ServerMetrics::ServerMetrics(const ServerInfo& info, const std::vector<std::string>& model_names) {
  TESSERA_CHECK(info.metric_prefix == "tessera" || info.metric_prefix == "vllm",
                "metrics.prefix: expected tessera or vllm, got '" << info.metric_prefix << "'");
  prefix_ = info.metric_prefix + ":";
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildGauge().Name(prefix_ + name).Help(help).Register(registry_);
  };
  auto counter = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildCounter().Name(prefix_ + name).Help(help).Register(registry_);
  };
  auto histogram = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildHistogram().Name(prefix_ + name).Help(help).Register(registry_);
  };
  running_ = gauge("num_requests_running", "Number of requests in model execution batches.");
  waiting_ = gauge("num_requests_waiting", "Number of requests waiting to be processed.");
  kv_usage_ = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  ttft_ = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.");
  itl_ = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.");
  e2e_ = histogram("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.");
  queue_time_ = histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.");
  prompt_hist_ = histogram("request_prompt_tokens", "Number of prefill tokens processed.");
  generation_hist_ = histogram("request_generation_tokens", "Number of generation tokens processed.");
  prompt_tokens_ = counter("prompt_tokens_total", "Number of prefill tokens processed.");
  generation_tokens_ = counter("generation_tokens_total", "Number of generation tokens processed.");
  success_ = counter("request_success_total", "Count of successfully processed requests.");
  failure_ = counter("request_failure_total",
                     "Count of requests that ended in an error, by reason (cancelled, deadline, error, or the front "
                     "end's rejection: invalid_request, queue_full, ...).");
  preemptions_ = counter("num_preemptions_total", "Cumulative number of preemption from the engine.");
  prefix_queries_ = counter("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.");
  prefix_hits_ = counter("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.");
  by_policy_ = counter("requests_by_attention_policy_total", "Generate requests started, by attention mask policy.");
  gauge("server_info", "Tessera build and serving information.")
      ->Add({{"backend", info.backend}, {"model", info.model}, {"profile", info.profile}, {"version", info.version}})
      .Set(1.0);
  if (!info.profile_labels.empty()) {
    Labels labels;
    for (const auto& [key, value] : info.profile_labels) labels[key] = value;
    gauge("profile_info", "The active tuner profile: what it chose (weight format, fusions, threads) and for what.")
        ->Add(labels)
        .Set(1.0);
  }
  cache_config_ = gauge("cache_config_info", "Information of the LLMEngine CacheConfig.");
  grammar_compile_ = histogram("grammar_compile_seconds",
                               "Time to compile a request's response format or tool-call grammar (cache hits included).");

  engine_model_label_ = model_names.empty() ? std::string() : model_names.front();
  // Series created up front, so that a scrape shows every one at 0 before the first request.
  for (const std::string& name : model_names) {
    const Labels m = model_label(name);
    ttft_->Add(m, kTtftBuckets);
    itl_->Add(m, kItlBuckets);
    e2e_->Add(m, kLatencyBuckets);
    queue_time_->Add(m, kLatencyBuckets);
    prompt_hist_->Add(m, kTokenBuckets);
    generation_hist_->Add(m, kTokenBuckets);
    prompt_tokens_->Add(m);
    generation_tokens_->Add(m);
    for (const char* r : kFinishedReasons) success_->Add({{"finished_reason", r}, {"model_name", name}});
    for (const char* r : kFailureReasons) failure_->Add({{"model_name", name}, {"reason", r}});
    by_policy_->Add({{"model_name", name}, {"policy", "causal"}});
    grammar_compile_->Add(m, kCompileBuckets);
  }
  const Labels engine = model_label(engine_model_label_);
  running_now_ = &running_->Add(engine);
  waiting_now_ = &waiting_->Add(engine);
  kv_usage_now_ = &kv_usage_->Add(engine);
  itl_engine_ = &itl_->Add(engine, kItlBuckets);
  grammar_masks_ = &histogram("grammar_mask_seconds",
                              "Time to fill a step's allowed-token bitmasks for its constrained sequences (on mask "
                              "threads, while the forward runs).")
                        ->Add(engine, kGrammarMaskBuckets);
  preemptions_->Add(engine);
  seconds_since_step_ = &gauge("engine_seconds_since_last_step",
                               "Seconds since the engine loop last finished a pass (a step, or an idle wake-up).")
                             ->Add({});
  fatal_errors_ = &counter("engine_fatal_errors_total",
                           "Fatal engine errors (a sticky device error, the engine thread gone); each ends the "
                           "engine, and the process unless limits.exit_on_fatal_error is false.")
                       ->Add({});
  prefix_queries_->Add(engine);
  prefix_hits_->Add(engine);
  spec_drafts_ = &counter("spec_decode_num_drafts_total", "Number of spec decoding drafts.")->Add(engine);
  spec_draft_tokens_ = &counter("spec_decode_num_draft_tokens_total", "Number of draft tokens.")->Add(engine);
  spec_accepted_tokens_ = &counter("spec_decode_num_accepted_tokens_total", "Number of accepted tokens.")->Add(engine);
  spec_accepted_per_position_ = counter("spec_decode_num_accepted_tokens_per_pos_total",
                                        "Accepted tokens per draft position.");
}

void ServerMetrics::on_speculation(int32_t drafted, int32_t accepted) {
  spec_drafts_->Increment();
  spec_draft_tokens_->Increment(drafted);
  spec_accepted_tokens_->Increment(accepted);
  for (int32_t position = 0; position < accepted; ++position) {
    spec_accepted_per_position_->Add({{"model_name", engine_model_label_}, {"position", std::to_string(position)}})
        .Increment();
  }
}

void ServerMetrics::set_engine_health(const EngineHealth& health) {
  seconds_since_step_->Set(health.seconds_since_step);
}

void ServerMetrics::on_engine_fatal_error() { fatal_errors_->Increment(); }

void ServerMetrics::on_step(int32_t running, int32_t waiting, double kv_cache_usage) {
  running_now_->Set(running);
  waiting_now_->Set(waiting);
  kv_usage_now_->Set(kv_cache_usage);
}

void ServerMetrics::on_request_started(const GenerateRequest& request, double queue_seconds, const std::string& policy) {
  queue_time_->Add(model_label(request.model), kLatencyBuckets).Observe(queue_seconds);
  by_policy_->Add({{"model_name", request.model}, {"policy", policy}}).Increment();
}

void ServerMetrics::on_first_token(const GenerateRequest& request, double ttft_seconds) {
  ttft_->Add(model_label(request.model), kTtftBuckets).Observe(ttft_seconds);
}

void ServerMetrics::on_token_interval(double seconds) { itl_engine_->Observe(seconds); }

void ServerMetrics::on_request_finished(const GenerateRequest& request, RequestFinishReason reason,
                                        int64_t prompt_tokens, int64_t completion_tokens, double e2e_seconds) {
  const Labels m = model_label(request.model);
  prompt_tokens_->Add(m).Increment(static_cast<double>(prompt_tokens));
  generation_tokens_->Add(m).Increment(static_cast<double>(completion_tokens));
  switch (reason) {
    case RequestFinishReason::kStop:
    case RequestFinishReason::kLength:
      success_->Add({{"finished_reason", finish_reason_name(reason)}, {"model_name", request.model}}).Increment();
      e2e_->Add(m, kLatencyBuckets).Observe(e2e_seconds);
      prompt_hist_->Add(m, kTokenBuckets).Observe(static_cast<double>(prompt_tokens));
      generation_hist_->Add(m, kTokenBuckets).Observe(static_cast<double>(completion_tokens));
      break;
    case RequestFinishReason::kCancelled:
    case RequestFinishReason::kDeadline:
    case RequestFinishReason::kError:
      failure_->Add({{"model_name", request.model}, {"reason", finish_reason_name(reason)}}).Increment();
      break;
  }
}

void ServerMetrics::on_preemption() { preemptions_->Add(model_label(engine_model_label_)).Increment(); }

void ServerMetrics::on_grammar_masks(double seconds) { grammar_masks_->Observe(seconds); }

void ServerMetrics::on_prefix_cache_query(int64_t queried, int64_t hit) {
  prefix_queries_->Add(model_label(engine_model_label_)).Increment(static_cast<double>(queried));
  prefix_hits_->Add(model_label(engine_model_label_)).Increment(static_cast<double>(hit));
}

void ServerMetrics::set_cache_info(const CacheInfo& cache) {
  cache_config_
      ->Add({{"block_size", std::to_string(cache.block_size)},
             {"cache_dtype", cache.cache_dtype},
             {"enable_prefix_caching", cache.prefix_caching ? "True" : "False"},
             {"num_gpu_blocks", std::to_string(cache.num_blocks)}})
      .Set(1.0);
}

void ServerMetrics::on_rejected(const std::string& model, const std::string& reason) {
  failure_->Add({{"model_name", model}, {"reason", reason}}).Increment();
}

void ServerMetrics::on_embedding(const std::string& model, int64_t prompt_tokens, double e2e_seconds) {
  const Labels m = model_label(model);
  prompt_tokens_->Add(m).Increment(static_cast<double>(prompt_tokens));
  prompt_hist_->Add(m, kTokenBuckets).Observe(static_cast<double>(prompt_tokens));
  e2e_->Add(m, kLatencyBuckets).Observe(e2e_seconds);
  success_->Add({{"finished_reason", "stop"}, {"model_name", model}}).Increment();
}

void ServerMetrics::on_grammar_compile(const std::string& model, double seconds) {
  grammar_compile_->Add(model_label(model), kCompileBuckets).Observe(seconds);
}

std::string ServerMetrics::expose() const { return prometheus::TextSerializer().Serialize(registry_.Collect()); }

}  // namespace tessera
