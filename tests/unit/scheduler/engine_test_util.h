// tests/unit/scheduler/engine_test_util.h: what the engine-loop tests share: the tiny random-weight
// fixtures from tests/golden (Llama, BERT), a stand-in tokenizer whose every id is one letter,
// a recording observer and a stream reader.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "engine/scheduler/engine_loop.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tokenizer/tokenizer.h"
#include "tests/unit/scheduler/letter_tokenizer.h"

namespace tessera::test {

inline std::string fixture_dir(const std::string& name) { return std::string(TESSERA_GOLDEN_FIXTURES) + "/" + name; }

// Wraps a CausalLm and throws from forward(), before running anything, when a poisoned token id is
// in the batch, or at its N-th call (failing_at_call: a tensor-parallel rank that fails while the
// others wait for it in a collective).
class FaultyLm final : public CausalLm {
 public:
  FaultyLm(std::unique_ptr<CausalLm> inner, int32_t poison) : inner_(std::move(inner)), poison_(poison) {}
  static std::unique_ptr<CausalLm> failing_at_call(std::unique_ptr<CausalLm> inner, int call) {
    auto lm = std::make_unique<FaultyLm>(std::move(inner), -1);
    lm->fail_at_call_ = call;
    return lm;
  }
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t cache_kv_heads() const override { return inner_->cache_kv_heads(); }
  Tensor forward(const ForwardBatch& batch, KvCacheStorage* cache, std::span<const int32_t> logit_rows,
                 const TensorObserver* observer) override {
    if (++calls_ == fail_at_call_) throw Error("test: injected failure in forward " + std::to_string(calls_));
    for (int32_t id : batch.token_ids) {
      if (id == poison_) throw Error("test: poisoned token in the batch");
    }
    return inner_->forward(batch, cache, logit_rows, observer);
  }
  void copy_kv(KvCacheStorage& cache, std::span<const int32_t> src_slots, std::span<const int32_t> dst_slots,
               std::span<const int32_t> rotate_by) override {
    inner_->copy_kv(cache, src_slots, dst_slots, rotate_by);
  }

 private:
  std::unique_ptr<CausalLm> inner_;
  int32_t poison_;
  int fail_at_call_ = 0;  // 0: never
  int calls_ = 0;
};

// Wraps an Encoder and throws from encode()/embed() when a poisoned token id is in the batch.
class FaultyEncoder final : public Encoder {
 public:
  FaultyEncoder(std::unique_ptr<Encoder> inner, int32_t poison) : inner_(std::move(inner)), poison_(poison) {}
  const ModelConfig& config() const override { return inner_->config(); }
  Tensor encode(const ForwardBatch& batch, const TensorObserver* observer) override {
    check(batch);
    return inner_->encode(batch, observer);
  }
  Tensor embed(const ForwardBatch& batch, const TensorObserver* observer) override {
    check(batch);
    return inner_->embed(batch, observer);
  }

 private:
  void check(const ForwardBatch& batch) const {
    for (int32_t id : batch.token_ids) {
      if (id == poison_) throw Error("test: poisoned token in the embedding batch");
    }
  }
  std::unique_ptr<Encoder> inner_;
  int32_t poison_;
};

class RecordingObserver final : public EngineObserver {
 public:
  void on_step(int32_t, int32_t, double) override {
    ++steps;
    const int ms = step_sleep_ms.load();
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  void on_request_started(const GenerateRequest&, double queue_seconds, const std::string& policy) override {
    std::lock_guard<std::mutex> lock(mutex);
    ++started;
    policies.push_back(policy);
    EXPECT_GE(queue_seconds, 0.0);
  }
  void on_first_token(const GenerateRequest&, double ttft) override {
    ++first_tokens;
    EXPECT_GE(ttft, 0.0);
  }
  void on_token_interval(double seconds) override {
    ++intervals;
    EXPECT_GE(seconds, 0.0);
  }
  void on_request_finished(const GenerateRequest&, RequestFinishReason reason, int64_t, int64_t, double e2e) override {
    std::lock_guard<std::mutex> lock(mutex);
    reasons.push_back(reason);
    EXPECT_GE(e2e, 0.0);
  }
  void on_preemption() override { ++preemptions; }
  void on_prefix_cache_query(int64_t queried, int64_t hit) override {
    prefix_queried += queried;
    prefix_hit += hit;
  }

  std::atomic<int> step_sleep_ms{0};
  std::atomic<int64_t> steps{0}, first_tokens{0}, intervals{0}, preemptions{0}, prefix_queried{0}, prefix_hit{0};
  std::mutex mutex;
  int started = 0;
  std::vector<std::string> policies;
  std::vector<RequestFinishReason> reasons;
};

// An engine serving the tiny Llama fixture as "tiny-llama" (LetterTokenizer), started. context > 0
// stretches the fixture's max_position_embeddings (RoPE takes any position) for long prompts.
inline std::unique_ptr<EngineLoop> make_tiny_llama_engine(Backend& backend, EngineObserver* observer,
                                                          const EngineConfig& config, int64_t context = 0) {
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  EngineLoop::ServedLm lm;
  lm.name = "tiny-llama";
  lm.config = load_model_config(files);
  if (context > 0) lm.config.max_position_embeddings = context;
  lm.model = make_causal_lm(lm.config, load_weights(files), backend);
  lm.tokenizer = std::make_shared<LetterTokenizer>(lm.config.vocab_size);
  std::vector<EngineLoop::ServedLm> lms;
  lms.push_back(std::move(lm));
  auto engine = std::make_unique<EngineLoop>(config, backend, std::move(lms), std::vector<EngineLoop::ServedEncoder>{},
                                             observer);
  engine->start();
  return engine;
}

// Everything one request streamed.
struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<StreamTokenLogprob> prompt_logprobs;  // from whichever event carried them
  std::string text;
  int deltas = 0;
  int finals = 0;
  StreamEvent final_event;
};

// Stats are published at the end of the engine's iteration, just after the final events went out.
inline EngineStats settled_stats(const EngineLoop& engine) {
  EngineStats st = engine.stats();
  for (int i = 0; i < 200 && (st.kv_blocks_used != 0 || st.running != 0 || st.waiting != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    st = engine.stats();
  }
  return st;
}

// Reads until the final event (fails the test after `limit`), then checks nothing follows it.
inline Collected collect(RequestStream& stream, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  Collected c;
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < give_up) {
    std::optional<StreamEvent> e = stream.next(std::chrono::milliseconds(100));
    if (!e) continue;
    c.prompt_logprobs.insert(c.prompt_logprobs.end(), e->prompt_logprobs.begin(), e->prompt_logprobs.end());
    if (e->final) {
      ++c.finals;
      c.final_event = *e;
      break;
    }
    ++c.deltas;
    c.tokens.insert(c.tokens.end(), e->tokens.begin(), e->tokens.end());
    for (const StreamTokenLogprob& lp : e->logprobs) c.logprobs.push_back(lp.logprob);
    c.text += e->text;
  }
  EXPECT_EQ(c.finals, 1) << "no final event within the limit";
  EXPECT_FALSE(stream.next(std::chrono::milliseconds(0)).has_value()) << "an event after the final one";
  return c;
}

}  // namespace tessera::test
