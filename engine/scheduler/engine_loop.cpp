// engine/scheduler/engine_loop.cpp: EngineLoop (see engine_loop.h): submit-side validation and the
// bounded queue, the engine thread, and per step the continuous-batching schedule (running decodes
// and prefill chunks under max_batch_tokens, preemption by recompute when KV blocks run out).
// Embedding batches run on the same thread between steps (engine_embed.cpp).
#include "engine/scheduler/engine_loop.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "common/error.h"
#include "engine/generation.h"
#include "engine/scheduler/engine_embed.h"
#include "engine/scheduler/request_channel.h"
#include "engine/scheduler/sequence_output.h"
#include "models/config/model_mask_policy.h"

namespace tessera {

const char* finish_reason_name(RequestFinishReason reason) {
  switch (reason) {
    case RequestFinishReason::kStop: return "stop";
    case RequestFinishReason::kLength: return "length";
    case RequestFinishReason::kCancelled: return "cancelled";
    case RequestFinishReason::kDeadline: return "deadline";
    case RequestFinishReason::kError: return "error";
  }
  return "error";
}

namespace {

constexpr const char* kShutdownMessage = "server shutting down";
// Sequences the default KV pool holds at max_model_len each (kv_num_blocks = 0).
constexpr int64_t kDefaultPoolSequences = 4;
// Prompt rows whose logits one step computes for prompt logprobs (beside each sequence's last
// row): bounds the step's logits at this many rows of the vocabulary.
constexpr int64_t kPromptLogprobRowsPerStep = 512;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One generate request inside the engine, from submit to its final event.
struct Sequence {
  GenerateRequest request;
  std::shared_ptr<RequestChannel> channel;
  std::shared_ptr<const Tokenizer> tokenizer;  // keeps output's tokenizer alive
  std::unique_ptr<SequenceOutput> output;
  MaskPolicy policy;
  SeqId id = 0;
  size_t lm = 0;                 // index of its served LM
  std::vector<int32_t> tokens;   // the prompt, then every generated token
  int64_t num_cached = 0;        // leading tokens whose K/V the cache holds (0 after a preemption)
  int64_t cached_prompt_tokens = 0;  // found in the prefix cache at the first admission
  // Prompt logprobs (sampling.prompt_logprobs): prompt tokens scored so far (token 1 onwards), and
  // the scores not yet sent, which go out with the request's first event.
  int64_t prompt_scored = 0;
  std::vector<StreamTokenLogprob> prompt_logprobs;
  // Prompt tokens still to score: such a sequence computes every prompt row's logits and attaches
  // no cached blocks.
  bool scoring_prompt() const {
    return request.sampling.prompt_logprobs.has_value() &&
           prompt_scored + 1 < static_cast<int64_t>(request.prompt.size());
  }
  bool registered = false;       // the Generator knows the sequence (has been in a step)
  bool admitted_once = false;    // counted out of the queue bound at first admission
  bool done = false;             // final event sent; swept from the lists after the step
  Clock::time_point arrival;
  Clock::time_point last_token_time;
};

struct LmSlot {
  EngineLoop::ServedLm served;
  int64_t max_model_len = 0;
  int32_t num_blocks = 0;
  std::unique_ptr<Generator> generator;
  std::deque<std::unique_ptr<Sequence>> waiting;  // preempted ones at the front, then arrival order
  std::vector<std::unique_ptr<Sequence>> running; // admission order: the back is the newest
};

}  // namespace

struct EngineLoop::Impl {
  EngineConfig config;
  Backend& backend;
  EngineObserver* observer = nullptr;
  std::vector<LmSlot> lms;
  std::vector<ServedEncoder> encoders;
  std::shared_ptr<EngineSignal> signal = std::make_shared<EngineSignal>();

  // Submit side, guarded by intake_mutex.
  std::mutex intake_mutex;
  std::condition_variable idle_cv;
  std::vector<std::unique_ptr<Sequence>> incoming;
  std::vector<std::unique_ptr<EmbedJob>> incoming_embeds;
  int32_t queued_generate = 0;  // submitted, never admitted, not finished: bounded by max_queue_size
  int32_t queued_embed = 0;     // embedding jobs not yet run
  int64_t outstanding = 0;      // submitted and not finished (generate and embed)
  SeqId next_id = 1;

  std::atomic<bool> accepting{true};
  std::atomic<bool> stopping{false};
  std::atomic<bool> stepping{false};
  std::thread thread;

  mutable std::mutex stats_mutex;
  EngineStats stats;

  // Engine thread only.
  std::deque<std::unique_ptr<EmbedJob>> embeds;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t segment_reused_tokens = 0;

  Impl(EngineConfig c, Backend& b, EngineObserver* o) : config(c), backend(b), observer(o) {}

  int find_lm(const std::string& name) const {
    for (size_t i = 0; i < lms.size(); ++i) {
      if (lms[i].served.name == name) return static_cast<int>(i);
    }
    return -1;
  }
  int find_encoder(const std::string& name) const {
    for (size_t i = 0; i < encoders.size(); ++i) {
      if (encoders[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
  std::string served_names() const {
    std::string names;
    for (const LmSlot& lm : lms) names += (names.empty() ? "" : ", ") + lm.served.name;
    for (const ServedEncoder& e : encoders) names += (names.empty() ? "" : ", ") + e.name;
    return names;
  }

  void run();
  void take_intake();
  void expire();
  bool step_lm(LmSlot& lm);
  void preempt(LmSlot& lm, size_t running_index);
  // Copies in the cached documents (segments) that start at seq's next position, while the free
  // blocks allow, and returns the tokens so placed.
  int64_t reuse_segments(LmSlot& lm, Sequence& seq, int64_t& free_blocks);
  // How many of seq's next tokens to compute, at most `budget`: a chunk stops where the next
  // document the index holds starts, so that the next step copies it in.
  int64_t chunk_size(LmSlot& lm, Sequence& seq, int64_t budget);
  // The sequence now fills the model's context (its next token ends it with "length").
  bool context_full(const LmSlot& lm, const Sequence& seq) const;
  void emit_token(LmSlot& lm, Sequence& seq, SequenceOutput::Advance advance);
  // Prompt logprobs, after a forward: the host logits of each all_logits input's rows, taken from
  // `earlier` and from its last row (`device_logits` row i, or `host_logits`[i]) when that row
  // predicts a prompt token.
  void score_rows(std::span<const Generator::SequenceInput> inputs, const Tensor& device_logits,
                  const std::vector<std::vector<float>>& host_logits, const Tensor& earlier,
                  const std::vector<bool>& emits, std::vector<std::vector<float>>& out);
  // Scores the prompt tokens that the n rows from seq.num_cached predict, from their logits.
  void score_prompt(LmSlot& lm, Sequence& seq, int64_t n, const std::vector<float>& rows_logits);
  void finish(LmSlot& lm, Sequence& seq, RequestFinishReason reason, std::string error = {});
  void sweep(LmSlot& lm);
  void run_embeddings();
  void publish_stats();
  void fail_all(const std::string& message);
  void shut_down();
  void job_done(int64_t count);
  bool has_work() const {
    if (!embeds.empty()) return true;
    for (const LmSlot& lm : lms) {
      if (!lm.waiting.empty() || !lm.running.empty()) return true;
    }
    return false;
  }
};

// ---- construction and the submit side ----

EngineLoop::EngineLoop(EngineConfig config, Backend& backend, std::vector<ServedLm> lms,
                       std::vector<ServedEncoder> encoders, EngineObserver* observer)
    : impl_(std::make_unique<Impl>(config, backend, observer)) {
  config.validate();
  TESSERA_CHECK(!lms.empty() || !encoders.empty(), "engine: no models to serve");
  for (ServedLm& served : lms) {
    TESSERA_CHECK(served.model != nullptr, "engine: model '" << served.name << "' has no graph");
    TESSERA_CHECK(served.tokenizer != nullptr, "engine: model '" << served.name << "' has no tokenizer");
    TESSERA_CHECK(impl_->find_lm(served.name) < 0, "engine: model name '" << served.name << "' is served twice");
    LmSlot slot;
    const int64_t context = served.config.max_position_embeddings;
    slot.max_model_len = config.max_model_len > 0 && (context <= 0 || config.max_model_len < context)
                             ? config.max_model_len
                             : context;
    TESSERA_CHECK(slot.max_model_len >= 2, "engine: model '" << served.name
                                               << "' has no usable context length (max_model_len "
                                               << config.max_model_len << ", max_position_embeddings " << context
                                               << ")");
    slot.num_blocks = config.kv_num_blocks > 0
                          ? config.kv_num_blocks
                          : static_cast<int32_t>(ceil_div(kDefaultPoolSequences * slot.max_model_len,
                                                          config.kv_block_size));
    GeneratorConfig gc;
    gc.block_size = config.kv_block_size;
    gc.num_blocks = slot.num_blocks;
    gc.prefix_caching = config.prefix_caching;
    slot.served = std::move(served);
    slot.generator = std::make_unique<Generator>(*slot.served.model, backend, gc);
    impl_->lms.push_back(std::move(slot));
  }
  for (ServedEncoder& served : encoders) {
    TESSERA_CHECK(served.model != nullptr, "engine: model '" << served.name << "' has no graph");
    TESSERA_CHECK(impl_->find_lm(served.name) < 0 && impl_->find_encoder(served.name) < 0,
                  "engine: model name '" << served.name << "' is served twice");
    impl_->encoders.push_back(std::move(served));
  }
}

EngineLoop::~EngineLoop() {
  impl_->stopping.store(true);
  impl_->signal->notify();
  if (impl_->thread.joinable()) {
    impl_->thread.join();
  } else {
    impl_->shut_down();  // never started: fail whatever was queued
  }
}

std::vector<std::pair<std::string, WarmUpReport>> EngineLoop::warm_up() {
  TESSERA_CHECK(!impl_->thread.joinable(), "engine: warm_up() must come before start()");
  std::vector<std::pair<std::string, WarmUpReport>> reports;
  for (LmSlot& lm : impl_->lms) {
    WarmUpConfig w;
    w.max_batch_tokens = impl_->config.max_batch_tokens;
    w.max_batch_seqs = std::min(impl_->config.max_running_sequences, impl_->config.max_batch_tokens);
    w.max_context = lm.max_model_len;
    reports.emplace_back(lm.served.name, lm.generator->warm_up(w));
  }
  return reports;
}

void EngineLoop::start() {
  TESSERA_CHECK(!impl_->thread.joinable(), "engine: start() called twice");
  impl_->stepping.store(true);
  impl_->thread = std::thread([this] { impl_->run(); });
}

SubmitResult EngineLoop::submit_generate(GenerateRequest request) {
  SubmitResult result;
  auto invalid = [&](std::string message) {
    result.error = SubmitError::kInvalid;
    result.message = std::move(message);
    return result;
  };
  if (!impl_->accepting.load()) {
    result.error = SubmitError::kDraining;
    result.message = "The server is shutting down and accepts no new requests.";
    return result;
  }
  const int lm_index = impl_->find_lm(request.model);
  if (lm_index < 0) {
    if (impl_->find_encoder(request.model) >= 0) {
      return invalid("model '" + request.model + "' is an embedding model; it does not generate text");
    }
    result.error = SubmitError::kUnknownModel;
    result.message = "The model '" + request.model + "' does not exist. Served models: " + impl_->served_names();
    return result;
  }
  const LmSlot& lm = impl_->lms[static_cast<size_t>(lm_index)];
  const ModelConfig& mc = lm.served.config;
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  if (prompt_tokens == 0) return invalid("prompt: must contain at least one token");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t id = request.prompt[i];
    if (id < 0 || id >= mc.vocab_size) {
      std::ostringstream os;
      os << "prompt: token id " << id << " at index " << i << " is outside the vocabulary [0, " << mc.vocab_size
         << ")";
      return invalid(os.str());
    }
  }
  try {
    request.sampling.validate();  // first: the length checks below read max_tokens
  } catch (const Error& e) {
    return invalid(e.what());
  }
  const int64_t completion_tokens = request.sampling.max_tokens;
  if (prompt_tokens + completion_tokens > lm.max_model_len) {
    std::ostringstream os;
    os << "This model's maximum context length is " << lm.max_model_len << " tokens. However, you requested "
       << prompt_tokens + completion_tokens << " tokens (" << prompt_tokens << " in the messages, "
       << completion_tokens << " in the completion). Please reduce the length of the messages or completion.";
    return invalid(os.str());
  }
  const int64_t blocks_needed = ceil_div(prompt_tokens + completion_tokens, impl_->config.kv_block_size);
  if (blocks_needed > lm.num_blocks) {
    std::ostringstream os;
    os << "This request needs " << blocks_needed << " KV cache blocks (" << prompt_tokens << " prompt + "
       << completion_tokens << " completion tokens at " << impl_->config.kv_block_size
       << " tokens per block) but the KV cache holds " << lm.num_blocks
       << " blocks. Please reduce the length of the messages or completion.";
    return invalid(os.str());
  }
  auto seq = std::make_unique<Sequence>();
  try {
    seq->policy = resolve_mask_policy(request.attention, mc, prompt_tokens);
    seq->output = std::make_unique<SequenceOutput>(request.sampling, request.prompt, mc, *lm.served.tokenizer);
  } catch (const Error& e) {
    return invalid(e.what());
  }
  seq->tokenizer = lm.served.tokenizer;
  seq->lm = static_cast<size_t>(lm_index);
  seq->tokens = request.prompt;
  seq->arrival = Clock::now();
  seq->request = std::move(request);
  seq->channel = std::make_shared<RequestChannel>(impl_->signal);
  result.stream = seq->channel;
  {
    std::lock_guard<std::mutex> lock(impl_->intake_mutex);
    if (impl_->queued_generate >= impl_->config.max_queue_size) {
      result.error = SubmitError::kQueueFull;
      result.message = "The engine queue is full (" + std::to_string(impl_->config.max_queue_size) +
                       " requests waiting). Please retry later.";
      result.stream.reset();
      return result;
    }
    seq->id = impl_->next_id++;
    ++impl_->queued_generate;
    ++impl_->outstanding;
    impl_->incoming.push_back(std::move(seq));
  }
  impl_->signal->notify();
  return result;
}

std::future<EmbedResult> EngineLoop::submit_embed(const std::string& model, std::vector<std::vector<int32_t>> inputs,
                                                  Clock::time_point deadline) {
  auto job = std::make_unique<EmbedJob>();
  std::future<EmbedResult> future = job->promise.get_future();
  auto fail = [&](SubmitError error, std::string message) {
    EmbedResult r;
    r.error = error;
    r.message = std::move(message);
    job->promise.set_value(std::move(r));
    return std::move(future);
  };
  if (!impl_->accepting.load()) {
    return fail(SubmitError::kDraining, "The server is shutting down and accepts no new requests.");
  }
  const int encoder_index = impl_->find_encoder(model);
  if (encoder_index < 0) {
    if (impl_->find_lm(model) >= 0) {
      return fail(SubmitError::kInvalid, "model '" + model + "' is a generation model; it does not serve embeddings");
    }
    return fail(SubmitError::kUnknownModel,
                "The model '" + model + "' does not exist. Served models: " + impl_->served_names());
  }
  const std::string problem =
      check_embed_inputs(inputs, impl_->encoders[static_cast<size_t>(encoder_index)].config);
  if (!problem.empty()) return fail(SubmitError::kInvalid, problem);
  job->encoder = static_cast<size_t>(encoder_index);
  job->inputs = std::move(inputs);
  job->deadline = deadline;
  {
    std::lock_guard<std::mutex> lock(impl_->intake_mutex);
    if (impl_->queued_embed >= impl_->config.max_queue_size) {
      return fail(SubmitError::kQueueFull, "The engine queue is full (" +
                                               std::to_string(impl_->config.max_queue_size) +
                                               " embedding requests waiting). Please retry later.");
    }
    ++impl_->queued_embed;
    ++impl_->outstanding;
    impl_->incoming_embeds.push_back(std::move(job));
  }
  impl_->signal->notify();
  return future;
}

void EngineLoop::stop_accepting() { impl_->accepting.store(false); }

bool EngineLoop::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->intake_mutex);
  return impl_->idle_cv.wait_for(lock, timeout, [this] { return impl_->outstanding == 0; });
}

EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  return impl_->stats;
}

bool EngineLoop::ready() const { return impl_->stepping.load() && !impl_->stopping.load(); }
bool EngineLoop::accepting() const { return impl_->accepting.load(); }

std::vector<std::string> EngineLoop::model_names() const {
  std::vector<std::string> names;
  for (const LmSlot& lm : impl_->lms) names.push_back(lm.served.name);
  for (const ServedEncoder& e : impl_->encoders) names.push_back(e.name);
  return names;
}

bool EngineLoop::is_embedding_model(const std::string& model) const { return impl_->find_encoder(model) >= 0; }

const ModelConfig* EngineLoop::find_config(const std::string& model) const {
  if (const int i = impl_->find_lm(model); i >= 0) return &impl_->lms[static_cast<size_t>(i)].served.config;
  if (const int i = impl_->find_encoder(model); i >= 0) return &impl_->encoders[static_cast<size_t>(i)].config;
  return nullptr;
}

std::shared_ptr<const Tokenizer> EngineLoop::find_tokenizer(const std::string& model) const {
  if (const int i = impl_->find_lm(model); i >= 0) return impl_->lms[static_cast<size_t>(i)].served.tokenizer;
  if (const int i = impl_->find_encoder(model); i >= 0) return impl_->encoders[static_cast<size_t>(i)].tokenizer;
  return nullptr;
}

int64_t EngineLoop::max_model_len(const std::string& model) const {
  if (const int i = impl_->find_lm(model); i >= 0) return impl_->lms[static_cast<size_t>(i)].max_model_len;
  if (const int i = impl_->find_encoder(model); i >= 0) {
    return impl_->encoders[static_cast<size_t>(i)].config.max_position_embeddings;
  }
  return 0;
}

int32_t EngineLoop::kv_num_blocks(const std::string& model) const {
  const int i = impl_->find_lm(model);
  return i >= 0 ? impl_->lms[static_cast<size_t>(i)].num_blocks : 0;
}

// ---- the engine thread ----

void EngineLoop::Impl::run() {
  bool was_busy = false;
  auto idle_since = std::chrono::steady_clock::now();
  bool step_memory_released = true;
  while (!stopping.load()) {
    bool stepped = false;
    try {
      take_intake();
      expire();
      run_embeddings();
      for (LmSlot& lm : lms) {
        if (!lm.running.empty() || !lm.waiting.empty()) stepped |= step_lm(lm);
      }
    } catch (const std::exception& e) {
      // Not from a forward (step_lm handles those per batch): an observer or the bookkeeping threw.
      // The state of the requests in flight is unknown, so they end with an error and the loop
      // keeps serving new ones.
      fail_all(std::string("engine error: ") + e.what());
      stepped = true;
    }
    if (const std::string failure = backend.failure(); !failure.empty()) {
      // A sticky device error: no later step can run. Everything in flight ends with an error,
      // new work is refused, and ready() turns false so the deployment restarts the process.
      accepting.store(false);
      take_intake();  // requests submitted during the failed step end with the same message
      fail_all("the " + std::string(backend.name()) + " backend failed; the server must restart: " + failure);
      break;
    }
    const bool busy = has_work();
    if (stepped || busy || was_busy) publish_stats();  // once more on going idle: gauges fall to 0
    was_busy = busy;
    const auto now = std::chrono::steady_clock::now();
    if (busy || stepped) {
      idle_since = now;
      step_memory_released = false;
    } else if (!step_memory_released && now - idle_since >= std::chrono::seconds(1)) {
      backend.release_step_memory();  // a second idle: the last burst's scratch goes back to the OS
      step_memory_released = true;
    }
    if (!busy) {
      signal->wait(std::chrono::milliseconds(1000));  // idle: sleeps until a submit, cancel or stop
    } else if (!stepped) {
      // Work exists but nothing could run (should not happen: every queued request fits an empty
      // pool); wait briefly rather than spin.
      signal->wait(std::chrono::milliseconds(1));
    }
  }
  shut_down();
  stepping.store(false);
}

void EngineLoop::Impl::take_intake() {
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::unique_ptr<EmbedJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(intake_mutex);
    seqs.swap(incoming);
    jobs.swap(incoming_embeds);
  }
  for (auto& seq : seqs) lms[seq->lm].waiting.push_back(std::move(seq));
  for (auto& job : jobs) embeds.push_back(std::move(job));
}

void EngineLoop::Impl::expire() {
  const Clock::time_point now = Clock::now();
  for (LmSlot& lm : lms) {
    auto check = [&](Sequence& seq) {
      if (seq.channel->cancelled()) {
        finish(lm, seq, RequestFinishReason::kCancelled);
      } else if (now >= seq.request.deadline) {
        finish(lm, seq, RequestFinishReason::kDeadline);
      }
    };
    for (auto& seq : lm.running) check(*seq);
    for (auto& seq : lm.waiting) check(*seq);
    sweep(lm);
  }
}

void EngineLoop::Impl::preempt(LmSlot& lm, size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(lm.running[running_index]);
  lm.running.erase(lm.running.begin() + static_cast<std::ptrdiff_t>(running_index));
  if (seq->registered) lm.generator->release(seq->id);
  seq->registered = false;
  seq->num_cached = 0;  // recompute: prompt + generated tokens are prefilled again on readmission
  lm.waiting.push_front(std::move(seq));
  ++preemptions;
  if (observer) observer->on_preemption();
}

bool EngineLoop::Impl::step_lm(LmSlot& lm) {
  const KvBlockPool& pool = lm.generator->block_pool();
  const int64_t block_size = pool.block_size();
  int64_t budget = config.max_batch_tokens;
  int64_t free_blocks = pool.blocks_free();
  // New table entries appending n tokens to seq takes (an upper bound: sliding-window eviction
  // only gives blocks back).
  auto blocks_needed = [&](const Sequence& seq, int64_t n) {
    return ceil_div(seq.num_cached + n, block_size) - ceil_div(seq.num_cached, block_size);
  };
  struct Planned {
    Sequence* seq;
    int64_t n;
  };
  std::vector<Planned> plan;
  int64_t prompt_rows = kPromptLogprobRowsPerStep;

  // Running sequences first, oldest first: a decode token each, or the next prefill chunk. When the
  // pool is short, a prefill chunk shrinks to what fits; otherwise the newest running sequence is
  // preempted (possibly this one). The oldest always fits: submit checked it fits an empty pool.
  for (size_t i = 0; i < lm.running.size() && budget > 0;) {
    Sequence& seq = *lm.running[i];
    reuse_segments(lm, seq, free_blocks);
    int64_t n = chunk_size(lm, seq, budget);
    if (seq.scoring_prompt()) {
      if (prompt_rows == 0) {
        ++i;  // its prompt continues next step
        continue;
      }
      n = std::min(n, prompt_rows);
    }
    bool preempted_self = false;
    while (blocks_needed(seq, n) > free_blocks) {
      const int64_t slack = ceil_div(seq.num_cached, block_size) * block_size - seq.num_cached;
      const int64_t fit = slack + free_blocks * block_size;
      if (fit >= 1 && fit < n) {
        n = fit;
        continue;
      }
      if (lm.running.size() - 1 > i) {
        const int32_t before = pool.blocks_free();
        preempt(lm, lm.running.size() - 1);
        free_blocks += pool.blocks_free() - before;
        continue;
      }
      preempt(lm, i);
      preempted_self = true;
      break;
    }
    if (preempted_self) break;
    free_blocks -= blocks_needed(seq, n);
    budget -= n;
    if (seq.scoring_prompt()) prompt_rows -= n;
    plan.push_back({&seq, n});
    ++i;
  }

  // Then waiting sequences, front first (preempted ones, then arrival order). One is admitted only
  // when its whole prompt (plus generated tokens, after a preemption) and one more token fit in the
  // free blocks, so admitting never forces a preemption at once.
  while (budget > 0 && !lm.waiting.empty() &&
         static_cast<int32_t>(lm.running.size()) < config.max_running_sequences) {
    Sequence& seq = *lm.waiting.front();
    const int64_t total = static_cast<int64_t>(seq.tokens.size());
    // Leading blocks the prefix cache holds are attached instead of computed; cached blocks no
    // sequence holds count as free until then, so attaching them uses up free blocks too.
    if (seq.scoring_prompt() && prompt_rows == 0) break;
    // A sequence that scores its prompt needs every prompt row's logits, so it computes them all.
    const PrefixHit hit = seq.scoring_prompt() ? PrefixHit{} : lm.generator->find_prefix(seq.tokens, seq.policy);
    const int64_t hit_blocks = static_cast<int64_t>(hit.blocks.size());
    if (ceil_div(total + 1, block_size) - hit_blocks + hit.unheld > free_blocks) break;
    lm.generator->start_with_prefix(seq.id, seq.tokens, seq.policy, hit);
    seq.registered = true;
    seq.num_cached = hit.tokens;
    if (!seq.admitted_once) seq.cached_prompt_tokens = std::min<int64_t>(hit.tokens, seq.request.prompt.size());
    prefix_queries += total;
    prefix_hits += hit.tokens;
    if (observer) observer->on_prefix_cache_query(total, hit.tokens);
    free_blocks -= hit.unheld;
    reuse_segments(lm, seq, free_blocks);
    int64_t n = chunk_size(lm, seq, budget);
    if (seq.scoring_prompt()) {
      n = std::min(n, prompt_rows);
      prompt_rows -= n;
    }
    free_blocks -= blocks_needed(seq, n);
    budget -= n;
    plan.push_back({&seq, n});
    if (!seq.admitted_once) {
      seq.admitted_once = true;
      {
        std::lock_guard<std::mutex> lock(intake_mutex);
        --queued_generate;
      }
      if (observer) {
        observer->on_request_started(seq.request, seconds_between(seq.arrival, Clock::now()), seq.policy.name());
      }
    }
    lm.running.push_back(std::move(lm.waiting.front()));
    lm.waiting.pop_front();
  }
  if (plan.empty()) return false;
  // Single-token rows first: a GPU backend runs that prefix through its decode kernel, reading the
  // keys in place, and gathers keys only for the prompt chunks after it.
  std::stable_partition(plan.begin(), plan.end(), [](const Planned& p) { return p.n == 1; });

  std::vector<Generator::SequenceInput> inputs;
  inputs.reserve(plan.size());
  for (const Planned& p : plan) {
    Sequence& seq = *p.seq;
    inputs.push_back({seq.id, std::span<const int32_t>(seq.tokens).subspan(static_cast<size_t>(seq.num_cached),
                                                                            static_cast<size_t>(p.n)),
                      &seq.policy, seq.scoring_prompt()});
    seq.registered = true;
  }
  // Rows whose prompt is now complete get a token; with a device sampler only those ids come back.
  std::vector<bool> emits(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    emits[i] = plan[i].seq->num_cached + plan[i].n >= static_cast<int64_t>(plan[i].seq->tokens.size());
  }
  std::vector<std::vector<float>> logits;
  std::vector<SampleOutcome> sampled;
  // Prompt logprobs: per input, its rows' logits on the host (before the last, then the last when
  // it predicts a prompt token).
  std::vector<std::vector<float>> prompt_rows_logits(plan.size());
  try {
    Tensor earlier;
    if (backend.samples_on_device()) {
      const Tensor out = lm.generator->forward(inputs, &earlier);
      score_rows(inputs, out, {}, earlier, emits, prompt_rows_logits);
      std::vector<SampleSpec> specs(plan.size());  // rows still in prefill: a greedy placeholder
      for (size_t i = 0; i < plan.size(); ++i) {
        if (emits[i] && plan[i].seq->request.sampling.max_tokens > 0) specs[i] = plan[i].seq->output->spec();
      }
      sampled = backend.sample(out, specs);
    } else {
      logits = lm.generator->step(inputs, &earlier);
      score_rows(inputs, Tensor(), logits, earlier, emits, prompt_rows_logits);
    }
  } catch (const std::exception& e) {
    // The forward failed: its sequences' K/V are unusable. They end with an error; others go on.
    const std::string message = std::string("forward failed: ") + e.what();
    for (const Planned& p : plan) finish(lm, *p.seq, RequestFinishReason::kError, message);
    sweep(lm);
    return true;
  }
  ++steps;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& seq = *plan[i].seq;
    const int64_t prompt_size = static_cast<int64_t>(seq.request.prompt.size());
    prompt_tokens_computed += std::clamp<int64_t>(prompt_size - seq.num_cached, 0, plan[i].n);
    try {
      if (inputs[i].all_logits) score_prompt(lm, seq, plan[i].n, prompt_rows_logits[i]);
    } catch (const std::exception& e) {
      finish(lm, seq, RequestFinishReason::kError, std::string("prompt logprobs failed: ") + e.what());
    }
    seq.num_cached += plan[i].n;
    if (!emits[i] || seq.done) continue;  // prefill not done yet
    if (seq.request.sampling.max_tokens == 0) {  // scores the prompt only
      finish(lm, seq, RequestFinishReason::kLength);
      continue;
    }
    try {
      if (sampled.empty()) {
        emit_token(lm, seq, seq.output->advance(logits[i], context_full(lm, seq)));
      } else {
        emit_token(lm, seq, seq.output->advance_sampled(sampled[i], context_full(lm, seq)));
      }
    } catch (const std::exception& e) {
      finish(lm, seq, RequestFinishReason::kError, std::string("sampling failed: ") + e.what());
    }
  }
  sweep(lm);
  return true;
}

void EngineLoop::Impl::score_rows(std::span<const Generator::SequenceInput> inputs, const Tensor& device_logits,
                                   const std::vector<std::vector<float>>& host_logits, const Tensor& earlier,
                                   const std::vector<bool>& emits, std::vector<std::vector<float>>& out) {
  bool any = false;
  for (const Generator::SequenceInput& in : inputs) any |= in.all_logits;
  if (!any) return;
  const std::vector<float> before =
      earlier.defined() && earlier.dim(0) > 0 ? backend.download(earlier) : std::vector<float>();
  const size_t vocab = earlier.defined() ? static_cast<size_t>(earlier.dim(1)) : 0;
  size_t at = 0;  // rows of `before` used so far
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].all_logits) continue;
    const size_t q = inputs[i].tokens.size();
    out[i].assign(before.begin() + static_cast<std::ptrdiff_t>(at * vocab),
                  before.begin() + static_cast<std::ptrdiff_t>((at + q - 1) * vocab));
    at += q - 1;
    if (emits[i]) continue;  // the last row predicts the first generated token, not a prompt token
    if (!host_logits.empty()) {
      out[i].insert(out[i].end(), host_logits[i].begin(), host_logits[i].end());
    } else {
      const std::vector<float> last = backend.download(device_logits.rows(static_cast<int64_t>(i), 1));
      out[i].insert(out[i].end(), last.begin(), last.end());
    }
  }
}

void EngineLoop::Impl::score_prompt(LmSlot& lm, Sequence& seq, int64_t n, const std::vector<float>& rows_logits) {
  const auto vocab = static_cast<size_t>(lm.served.config.vocab_size);
  const auto prompt_size = static_cast<int64_t>(seq.request.prompt.size());
  const int32_t top_n = *seq.request.sampling.prompt_logprobs;
  const int64_t rows = static_cast<int64_t>(rows_logits.size() / vocab);
  TESSERA_CHECK(rows <= n, "prompt logprobs: " << rows << " rows of logits for " << n << " tokens");
  // Row r holds position num_cached + r, whose logits predict the token after it. After a
  // preemption the prompt runs again: tokens already scored are not scored twice.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t target = seq.num_cached + r + 1;
    if (target >= prompt_size) break;
    if (target != seq.prompt_scored + 1) continue;
    const auto row = std::span<const float>(rows_logits).subspan(static_cast<size_t>(r) * vocab, vocab);
    seq.prompt_logprobs.push_back(SequenceOutput::score(row, seq.request.prompt[static_cast<size_t>(target)], top_n));
    ++seq.prompt_scored;
  }
}

int64_t EngineLoop::Impl::reuse_segments(LmSlot& lm, Sequence& seq, int64_t& free_blocks) {
  if (seq.scoring_prompt()) return 0;  // it needs every prompt row's logits
  const int64_t block_size = lm.generator->block_pool().block_size();
  int64_t reused = 0;
  while (seq.registered && seq.num_cached < static_cast<int64_t>(seq.tokens.size())) {
    const std::optional<SegmentHit> hit = lm.generator->find_segment(seq.id, seq.tokens, seq.num_cached);
    if (!hit) break;
    const int64_t new_blocks = ceil_div(seq.num_cached + hit->length, block_size) - ceil_div(seq.num_cached, block_size);
    if (new_blocks + hit->unheld > free_blocks) break;  // computed instead
    lm.generator->reuse_segment(seq.id, seq.tokens, *hit);
    free_blocks -= new_blocks;  // the sources, held only during the copy, are free again
    seq.num_cached += hit->length;
    reused += hit->length;
  }
  if (reused > 0) {
    segment_reused_tokens += reused;
    if (seq.output->num_generated() == 0) seq.cached_prompt_tokens += reused;
  }
  return reused;
}

int64_t EngineLoop::Impl::chunk_size(LmSlot& lm, Sequence& seq, int64_t budget) {
  const int64_t remaining = static_cast<int64_t>(seq.tokens.size()) - seq.num_cached;
  int64_t n = std::min(remaining, budget);
  if (seq.registered && n > 1 && !seq.scoring_prompt()) {
    const int64_t next = lm.generator->next_reusable_segment(seq.id, seq.tokens, seq.num_cached);
    if (next > seq.num_cached) n = std::min(n, next - seq.num_cached);
  }
  return n;
}

bool EngineLoop::Impl::context_full(const LmSlot& lm, const Sequence& seq) const {
  return static_cast<int64_t>(seq.tokens.size()) + 1 >= lm.max_model_len;
}

void EngineLoop::Impl::emit_token(LmSlot& lm, Sequence& seq, SequenceOutput::Advance advance) {
  seq.tokens.push_back(advance.token);
  const Clock::time_point now = Clock::now();
  if (observer) {
    if (seq.output->num_generated() == 1) {
      observer->on_first_token(seq.request, seconds_between(seq.arrival, now));
    } else {
      observer->on_token_interval(seconds_between(seq.last_token_time, now));
    }
  }
  seq.last_token_time = now;
  advance.delta.prompt_logprobs = std::move(seq.prompt_logprobs);
  seq.prompt_logprobs.clear();
  seq.channel->push(std::move(advance.delta));
  if (advance.finish) finish(lm, seq, *advance.finish);
}

void EngineLoop::Impl::finish(LmSlot& lm, Sequence& seq, RequestFinishReason reason, std::string error) {
  if (seq.done) return;
  seq.done = true;
  if (seq.registered) lm.generator->release(seq.id);
  seq.registered = false;
  StreamEvent last;
  last.final = true;
  last.finish_reason = reason;
  last.error = std::move(error);
  last.prompt_tokens = static_cast<int64_t>(seq.request.prompt.size());
  last.completion_tokens = seq.output->num_generated();
  last.cached_prompt_tokens = seq.cached_prompt_tokens;
  last.prompt_logprobs = std::move(seq.prompt_logprobs);
  seq.prompt_logprobs.clear();
  seq.channel->push(std::move(last));
  if (observer) {
    observer->on_request_finished(seq.request, reason, static_cast<int64_t>(seq.request.prompt.size()),
                                  seq.output->num_generated(), seconds_between(seq.arrival, Clock::now()));
  }
  ++finished;
  std::lock_guard<std::mutex> lock(intake_mutex);
  if (!seq.admitted_once) --queued_generate;
  if (--outstanding == 0) idle_cv.notify_all();
}

void EngineLoop::Impl::job_done(int64_t count) {
  std::lock_guard<std::mutex> lock(intake_mutex);
  queued_embed -= static_cast<int32_t>(count);
  outstanding -= count;
  if (outstanding == 0) idle_cv.notify_all();
}

void EngineLoop::Impl::sweep(LmSlot& lm) {
  auto done = [](const std::unique_ptr<Sequence>& s) { return s->done; };
  lm.running.erase(std::remove_if(lm.running.begin(), lm.running.end(), done), lm.running.end());
  lm.waiting.erase(std::remove_if(lm.waiting.begin(), lm.waiting.end(), done), lm.waiting.end());
}

void EngineLoop::Impl::run_embeddings() {
  if (embeds.empty()) return;
  // Whole jobs, oldest first, until this round holds max_batch_tokens tokens (at least one job), so
  // a flood of embeddings delays the next decode step by about one step's worth of work.
  std::vector<std::unique_ptr<EmbedJob>> round;
  int64_t tokens = 0;
  while (!embeds.empty() && (round.empty() || tokens < config.max_batch_tokens)) {
    tokens += embeds.front()->num_tokens();
    round.push_back(std::move(embeds.front()));
    embeds.pop_front();
  }
  run_embed_round(round, encoders, backend, config.max_batch_tokens);
  job_done(static_cast<int64_t>(round.size()));
}

void EngineLoop::Impl::publish_stats() {
  EngineStats s;
  int64_t used = 0;
  int64_t total = 0;
  for (const LmSlot& lm : lms) {
    s.running += static_cast<int32_t>(lm.running.size());
    s.waiting += static_cast<int32_t>(lm.waiting.size());
    used += lm.generator->block_pool().blocks_used();
    total += lm.generator->block_pool().config().num_blocks;
  }
  s.kv_blocks_used = static_cast<int32_t>(used);
  s.kv_blocks_total = static_cast<int32_t>(total);
  s.kv_cache_usage = total > 0 ? static_cast<double>(used) / static_cast<double>(total) : 0.0;
  s.steps = steps;
  s.preemptions = preemptions;
  s.requests_finished = finished;
  s.embed_waiting = static_cast<int32_t>(embeds.size());
  s.prefix_cache_queries = prefix_queries;
  s.prefix_cache_hits = prefix_hits;
  s.prompt_tokens_computed = prompt_tokens_computed;
  s.segment_reused_tokens = segment_reused_tokens;
  for (const LmSlot& lm : lms) {
    s.kv_blocks_cached += lm.generator->block_pool().blocks_cached();
    s.prefix_cache_evictions += lm.generator->block_pool().cache_evictions();
  }
  if (observer) observer->on_step(s.running, s.waiting, s.kv_cache_usage);
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats = s;
}

void EngineLoop::Impl::fail_all(const std::string& message) {
  for (LmSlot& lm : lms) {
    for (auto& seq : lm.running) finish(lm, *seq, RequestFinishReason::kError, message);
    for (auto& seq : lm.waiting) finish(lm, *seq, RequestFinishReason::kError, message);
    sweep(lm);
  }
}

void EngineLoop::Impl::shut_down() {
  take_intake();
  fail_all(kShutdownMessage);
  for (auto& job : embeds) {
    EmbedResult r;
    r.error = SubmitError::kDraining;
    r.message = kShutdownMessage;
    job->promise.set_value(std::move(r));
  }
  job_done(static_cast<int64_t>(embeds.size()));
  embeds.clear();
  publish_stats();
}

}  // namespace tessera
