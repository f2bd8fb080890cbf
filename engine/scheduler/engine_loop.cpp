// engine/scheduler/engine_loop.cpp: EngineLoop (see engine_loop.h): submit-side validation and the
// bounded queue, and the engine thread, whose step for each served LM is schedule -> execute ->
// update (scheduler.h, engine/executor.h). Embedding batches run on the same thread between steps
// (engine_embed.cpp).
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
#include "engine/draft_model_drafter.h"
#include "engine/executor.h"
#include "engine/scheduler/engine_embed.h"
#include "engine/scheduler/request_channel.h"
#include "engine/scheduler/scheduler.h"
#include "engine/scheduler/sequence_output.h"
#include "models/config/model_mask_policy.h"

namespace tessera {

namespace {

constexpr const char* kShutdownMessage = "server shutting down";
// Sequences the default KV pool holds at max_model_len each (kv_num_blocks = 0).
constexpr int64_t kDefaultPoolSequences = 4;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct LmSlot {
  EngineLoop::ServedLm served;
  int64_t max_model_len = 0;
  int32_t num_blocks = 0;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Executor> executor;
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
  // Submitted and not finished (generate and embed). Changed under intake_mutex; atomic so that
  // health() can read it without waiting on the engine.
  std::atomic<int64_t> outstanding{0};
  SeqId next_id = 1;

  std::atomic<bool> accepting{true};
  std::atomic<bool> stopping{false};
  std::atomic<bool> stepping{false};
  std::thread thread;
  // The heartbeat: when the engine loop last began or finished a pass, as Clock ticks.
  std::atomic<Clock::rep> last_pass{0};

  mutable std::mutex stats_mutex;
  EngineStats stats;
  std::string fatal_error;  // guarded by stats_mutex; set once, when the loop ends on an error

  // Engine thread only.
  std::deque<std::unique_ptr<EmbedJob>> embeds;
  int64_t steps_started = 0;      // forwards begun, for faults.fail_step
  std::string injected_failure;   // faults.fail_step fired: the loop treats it as a sticky backend error

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

  LmSlot make_slot(ServedLm served);
  std::unique_ptr<Drafter> drafter_for(const ServedLm& served);
  Scheduler::Lifecycle lifecycle();
  void run();
  // The loop proper; returns the fatal error that ended it, or "" when it was stopped.
  std::string run_steps();
  // A sticky backend error (or an injected one): fails everything in flight and returns the
  // message; "" when the backend is fine.
  std::string check_backend();
  void beat() { last_pass.store(Clock::now().time_since_epoch().count()); }
  void inject_faults();
  void take_intake();
  void expire();
  // One step of an LM: schedule -> execute -> update. False when nothing could run.
  bool step(LmSlot& lm);
  void run_embeddings();
  void publish_stats();
  void fail_all(const std::string& message);
  void shut_down();
  void job_done(int64_t count);
  bool has_work() const {
    if (!embeds.empty()) return true;
    for (const LmSlot& lm : lms) {
      if (lm.scheduler->has_work()) return true;
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
    impl_->lms.push_back(impl_->make_slot(std::move(served)));
  }
  for (ServedEncoder& served : encoders) {
    TESSERA_CHECK(served.model != nullptr, "engine: model '" << served.name << "' has no graph");
    TESSERA_CHECK(impl_->find_lm(served.name) < 0 && impl_->find_encoder(served.name) < 0,
                  "engine: model name '" << served.name << "' is served twice");
    impl_->encoders.push_back(std::move(served));
  }
}

std::unique_ptr<Drafter> EngineLoop::Impl::drafter_for(const ServedLm& served) {
  const bool wants_model = config.speculative.method == "draft_model";
  TESSERA_CHECK(wants_model == (served.draft_model != nullptr),
                "engine: model '" << served.name << "' "
                                  << (wants_model ? "has no draft model for speculative.method draft_model"
                                                  : "brings a draft model, but speculative.method is not draft_model"));
  if (!wants_model) return make_drafter(config.speculative);
  TESSERA_CHECK(served.draft_model->config().vocab_size == served.config.vocab_size,
                "speculative.draft_model: its vocabulary has " << served.draft_model->config().vocab_size
                                                               << " tokens, model '" << served.name << "''s "
                                                               << served.config.vocab_size);
  return std::make_unique<DraftModelDrafter>(*served.draft_model, backend, config.speculative.draft_kv_tokens);
}

LmSlot EngineLoop::Impl::make_slot(ServedLm served) {
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
  SchedulerConfig sc;
  sc.max_batch_tokens = config.max_batch_tokens;
  sc.max_running_sequences = config.max_running_sequences;
  sc.prefill = config.prefill;
  sc.num_speculative_tokens = config.speculative.enabled() ? config.speculative.num_speculative_tokens : 0;
  sc.speculation_max_running = config.speculative.disable_by_batch_size;
  sc.untimed_row_cost = config.speculative.untimed_row_cost;
  sc.max_model_len = slot.max_model_len;
  sc.kv.block_size = config.kv_block_size;
  sc.kv.num_blocks = slot.num_blocks;
  sc.kv.prefix_caching = config.prefix_caching;
  slot.served = std::move(served);
  slot.scheduler = std::make_unique<Scheduler>(sc, observer, lifecycle(), drafter_for(slot.served));
  std::vector<RankShard> followers;
  for (const ServedLm::OtherRank& rank : slot.served.other_ranks) followers.push_back({rank.model.get(), rank.backend});
  slot.executor =
      std::make_unique<Executor>(*slot.served.model, backend, slot.num_blocks, config.kv_block_size, followers);
  return slot;
}

// The queue bound counts requests never admitted; wait_idle waits for every request to end.
Scheduler::Lifecycle EngineLoop::Impl::lifecycle() {
  Scheduler::Lifecycle hooks;
  hooks.admitted = [this](const Sequence&) {
    std::lock_guard<std::mutex> lock(intake_mutex);
    --queued_generate;
  };
  hooks.finished = [this](const Sequence& seq) {
    std::lock_guard<std::mutex> lock(intake_mutex);
    if (!seq.admitted_once) --queued_generate;
    if (--outstanding == 0) idle_cv.notify_all();
  };
  return hooks;
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
    w.verify_shapes = impl_->config.speculative.enabled();
    WarmUpReport report = lm.executor->warm_up(w);
    if (!report.decode_step_seconds.empty()) {
      lm.scheduler->set_step_costs(StepCosts(report.decode_batches, report.decode_step_seconds));
    }
    reports.emplace_back(lm.served.name, std::move(report));
  }
  return reports;
}

void EngineLoop::start() {
  TESSERA_CHECK(!impl_->thread.joinable(), "engine: start() called twice");
  impl_->stepping.store(true);
  impl_->beat();
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
    seq->kv.policy = resolve_mask_policy(request.attention, mc, prompt_tokens);
    seq->output = std::make_unique<SequenceOutput>(request.sampling, request.prompt, mc, *lm.served.tokenizer);
    if (request.grammar) seq->grammar = std::make_unique<GrammarMatcher>(request.grammar);
  } catch (const std::exception& e) {
    return invalid(e.what());
  }
  seq->tokenizer = lm.served.tokenizer;
  seq->lm = static_cast<size_t>(lm_index);
  seq->kv.tokens = request.prompt;
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
    seq->kv.id = impl_->next_id++;
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

EngineHealth EngineLoop::health(Clock::time_point now) const {
  EngineHealth h;
  h.thread_alive = impl_->stepping.load();
  h.pending = impl_->outstanding.load();
  const Clock::time_point last_pass{Clock::duration(impl_->last_pass.load())};
  h.seconds_since_step = std::max(0.0, std::chrono::duration<double>(now - last_pass).count());
  h.stalled = h.thread_alive && h.has_work() && h.seconds_since_step > impl_->config.stall_timeout_s;
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  h.fatal_error = impl_->fatal_error;
  return h;
}

std::string EngineHealth::reason() const {
  if (!fatal_error.empty()) return "engine failed: " + fatal_error;
  if (!thread_alive) return "engine thread is not running";
  if (stalled) {
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(1);
    os << "engine stalled: no step finished for " << seconds_since_step << " s with " << pending
       << (pending == 1 ? " request" : " requests") << " waiting or running";
    return os.str();
  }
  return {};
}

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
  std::string fatal;
  try {
    fatal = run_steps();
    shut_down();
  } catch (const std::exception& e) {
    // Nothing below the loop should throw; if it does, the thread must not take the process down
    // with std::terminate: health() reports it and the serve loop decides.
    fatal = std::string("engine thread died: ") + e.what();
    try {
      shut_down();
    } catch (const std::exception&) {
    }
  }
  if (!fatal.empty()) {
    std::lock_guard<std::mutex> lock(stats_mutex);
    fatal_error = fatal;
  }
  stepping.store(false);
}

std::string EngineLoop::Impl::run_steps() {
  bool was_busy = false;
  auto idle_since = std::chrono::steady_clock::now();
  bool step_memory_released = true;
  while (!stopping.load()) {
    beat();  // woken: the loop is alive, so a stall is timed from here, not from the last idle pass
    bool stepped = false;
    try {
      take_intake();
      expire();
      run_embeddings();
      for (LmSlot& lm : lms) {
        if (lm.scheduler->has_work()) stepped |= step(lm);
      }
    } catch (const std::exception& e) {
      // Not from a forward (step handles those per batch): an observer or the bookkeeping threw.
      // The state of the requests in flight is unknown, so they end with an error and the loop
      // keeps serving new ones.
      fail_all(std::string("engine error: ") + e.what());
      stepped = true;
    }
    if (std::string failure = check_backend(); !failure.empty()) return failure;
    beat();
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
  return {};
}

std::string EngineLoop::Impl::check_backend() {
  const std::string failure = injected_failure.empty() ? backend.failure() : injected_failure;
  if (failure.empty()) return {};
  // A sticky device error: no later step can run. Everything in flight ends with an error, new
  // work is refused, and ready() turns false so the deployment restarts the process.
  accepting.store(false);
  take_intake();  // requests submitted during the failed step end with the same message
  fail_all("the " + std::string(backend.name()) + " backend failed; the server must restart: " + failure);
  return failure;
}

// Test switches (EngineFaults): a slow step, and a step that fails as a sticky device error does.
void EngineLoop::Impl::inject_faults() {
  ++steps_started;
  if (config.faults.step_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config.faults.step_delay_ms));
  }
  if (config.faults.fail_step > 0 && steps_started == config.faults.fail_step) {
    injected_failure = "debug.fail_step: step " + std::to_string(steps_started) + " failed (injected)";
    TESSERA_FAIL(injected_failure);
  }
}

void EngineLoop::Impl::take_intake() {
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::unique_ptr<EmbedJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(intake_mutex);
    seqs.swap(incoming);
    jobs.swap(incoming_embeds);
  }
  for (auto& seq : seqs) lms[seq->lm].scheduler->add(std::move(seq));
  for (auto& job : jobs) embeds.push_back(std::move(job));
}

void EngineLoop::Impl::expire() {
  for (LmSlot& lm : lms) lm.scheduler->expire(Clock::now());
}

bool EngineLoop::Impl::step(LmSlot& lm) {
  const Clock::time_point start = Clock::now();
  const StepPlan plan = lm.scheduler->schedule(start);
  if (plan.empty()) return false;
  StepResult result;
  try {
    inject_faults();
    result = lm.executor->execute(plan);
  } catch (const std::exception& e) {
    lm.scheduler->fail_step(plan, std::string("forward failed: ") + e.what());
    return true;
  }
  const Clock::time_point done = Clock::now();
  lm.scheduler->observe_step(plan, std::chrono::duration<double>(done - start).count());
  lm.scheduler->update(plan, std::move(result), done);
  return true;
}

void EngineLoop::Impl::job_done(int64_t count) {
  std::lock_guard<std::mutex> lock(intake_mutex);
  queued_embed -= static_cast<int32_t>(count);
  outstanding -= count;
  if (outstanding == 0) idle_cv.notify_all();
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
    const Scheduler& scheduler = *lm.scheduler;
    const SchedulerCounters& counters = scheduler.counters();
    s.running += scheduler.num_running();
    s.waiting += scheduler.num_waiting();
    used += scheduler.pool().blocks_used();
    total += scheduler.pool().config().num_blocks;
    s.steps += counters.steps;
    s.preemptions += counters.preemptions;
    s.requests_finished += counters.finished;
    s.prefix_cache_queries += counters.prefix_queries;
    s.prefix_cache_hits += counters.prefix_hits;
    s.prompt_tokens_computed += counters.prompt_tokens_computed;
    s.segment_reused_tokens += counters.segment_reused_tokens;
    s.spec_drafts += counters.spec_drafts;
    s.spec_draft_tokens += counters.spec_draft_tokens;
    s.spec_accepted_tokens += counters.spec_accepted_tokens;
    s.kv_blocks_cached += scheduler.pool().blocks_cached();
    s.prefix_cache_evictions += scheduler.pool().cache_evictions();
  }
  s.kv_blocks_used = static_cast<int32_t>(used);
  s.kv_blocks_total = static_cast<int32_t>(total);
  s.kv_cache_usage = total > 0 ? static_cast<double>(used) / static_cast<double>(total) : 0.0;
  s.embed_waiting = static_cast<int32_t>(embeds.size());
  if (observer) observer->on_step(s.running, s.waiting, s.kv_cache_usage);
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats = s;
}

void EngineLoop::Impl::fail_all(const std::string& message) {
  for (LmSlot& lm : lms) lm.scheduler->fail_all(message);
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
