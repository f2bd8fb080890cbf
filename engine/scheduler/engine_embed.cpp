// engine/scheduler/engine_embed.cpp: embedding inputs check and batched encoder forwards (see
// engine_embed.h).
#include "engine/scheduler/engine_embed.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <sstream>

#include "kernels/backend/attention_plan.h"
#include "models/config/encoder_input.h"
#include "models/config/model_mask_policy.h"

namespace tessera {

int64_t EmbedJob::num_tokens() const {
  int64_t n = 0;
  for (const auto& input : inputs) n += static_cast<int64_t>(input.size());
  return n;
}

std::string check_embed_inputs(const std::vector<std::vector<int32_t>>& inputs, const ModelConfig& config) {
  if (inputs.empty()) return "input: at least one input is required";
  std::ostringstream os;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t>& input = inputs[i];
    if (input.empty()) {
      os << "input[" << i << "] is empty: every input needs at least one token";
      return os.str();
    }
    // Front ends truncate (or refuse) with fit_encoder_inputs before submitting; the engine only
    // guards the same limit, so a direct caller cannot embed past what the CLI and server allow.
    const EncoderInputLimit limit = encoder_input_limit(config);
    if (limit.tokens > 0 && static_cast<int64_t>(input.size()) > limit.tokens) {
      return EncoderInputOverLimit{i, static_cast<int64_t>(input.size()), limit}.message(
          "the engine does not truncate; truncate it first (fit_encoder_inputs) or shorten it");
    }
    for (size_t t = 0; t < input.size(); ++t) {
      if (input[t] < 0 || input[t] >= config.vocab_size) {
        os << "input[" << i << "]: token id " << input[t] << " at index " << t << " is outside the vocabulary [0, "
           << config.vocab_size << ")";
        return os.str();
      }
    }
  }
  return {};
}

namespace {

struct InputRef {
  EmbedJob* job;
  size_t index;
};

// One packed forward over refs; writes each embedding into its job's result.
void embed_batch(EngineLoop::ServedEncoder& encoder, Backend& backend, const std::vector<InputRef>& refs,
                 std::vector<EmbedResult*>& results_of_job, const std::vector<EmbedJob*>& jobs) {
  const MaskPolicy policy = default_mask_policy(encoder.config);
  std::vector<int32_t> packed;
  std::vector<AttentionPlan::Sequence> seqs;
  for (const InputRef& ref : refs) {
    const std::vector<int32_t>& input = ref.job->inputs[ref.index];
    packed.insert(packed.end(), input.begin(), input.end());
    AttentionPlan::Sequence s;
    s.q_len = static_cast<int32_t>(input.size());
    s.kv_len = s.q_len;
    s.policy = &policy;
    seqs.push_back(s);
  }
  AttentionPlan plan = AttentionPlan::build(seqs, /*block_size=*/0);
  ForwardBatch batch;
  batch.token_ids = packed;
  batch.plan = &plan;
  batch.device_token_ids = backend.prepare_step(plan, packed);
  const Tensor out = backend.run_step(encoder.model.get(), [&] { return encoder.model->embed(batch); });
  std::vector<float> flat = backend.download(out);
  const size_t hidden = static_cast<size_t>(out.dim(1));
  if (encoder.config.normalize_embeddings && out.type() != ScalarType::kF32) {
    // The device normalised in fp32 but stored the unit vectors in bf16/fp16, whose rounding leaves
    // norms of 1 +- 2^-8; clients take dot products as cosines, so the fp32 copy is made unit again.
    for (size_t r = 0; r < flat.size() / hidden; ++r) {
      double sum = 0;
      for (size_t i = 0; i < hidden; ++i) sum += double(flat[r * hidden + i]) * flat[r * hidden + i];
      const double scale = sum > 0 ? 1.0 / std::sqrt(sum) : 1.0;
      for (size_t i = 0; i < hidden; ++i) flat[r * hidden + i] = static_cast<float>(flat[r * hidden + i] * scale);
    }
  }
  for (size_t r = 0; r < refs.size(); ++r) {
    const size_t job = static_cast<size_t>(std::find(jobs.begin(), jobs.end(), refs[r].job) - jobs.begin());
    results_of_job[job]->embeddings[refs[r].index].assign(flat.begin() + r * hidden, flat.begin() + (r + 1) * hidden);
  }
}

}  // namespace

void run_embed_round(std::vector<std::unique_ptr<EmbedJob>>& round, std::vector<EngineLoop::ServedEncoder>& encoders,
                     Backend& backend, int64_t max_batch_tokens) {
  const Clock::time_point now = Clock::now();
  std::vector<EmbedResult> results(round.size());
  std::vector<EmbedResult*> result_ptrs;
  std::vector<EmbedJob*> jobs;
  std::vector<bool> runnable(round.size(), true);
  for (size_t j = 0; j < round.size(); ++j) {
    jobs.push_back(round[j].get());
    result_ptrs.push_back(&results[j]);
    results[j].embeddings.resize(round[j]->inputs.size());
    results[j].prompt_tokens = round[j]->num_tokens();
    if (now >= round[j]->deadline) {
      runnable[j] = false;
      results[j].error = SubmitError::kInvalid;
      results[j].deadline_exceeded = true;
      results[j].message = "deadline exceeded before the embedding batch ran";
    }
  }
  for (size_t e = 0; e < encoders.size(); ++e) {
    // Inputs of this encoder's jobs, packed greedily in submit order.
    std::vector<InputRef> batch;
    int64_t batch_tokens = 0;
    auto flush = [&] {
      if (batch.empty()) return;
      try {
        embed_batch(encoders[e], backend, batch, result_ptrs, jobs);
      } catch (const std::exception& ex) {
        for (const InputRef& ref : batch) {
          const size_t j = static_cast<size_t>(std::find(jobs.begin(), jobs.end(), ref.job) - jobs.begin());
          runnable[j] = false;
          results[j].error = SubmitError::kFailed;
          results[j].message = std::string("embedding forward failed: ") + ex.what();
        }
      }
      batch.clear();
      batch_tokens = 0;
    };
    for (size_t j = 0; j < round.size(); ++j) {
      if (round[j]->encoder != e || !runnable[j]) continue;
      for (size_t i = 0; i < round[j]->inputs.size(); ++i) {
        const int64_t n = static_cast<int64_t>(round[j]->inputs[i].size());
        if (!batch.empty() && batch_tokens + n > max_batch_tokens) flush();
        batch.push_back({round[j].get(), i});
        batch_tokens += n;
      }
    }
    flush();
  }
  for (size_t j = 0; j < round.size(); ++j) {
    if (results[j].error != SubmitError::kNone) {
      results[j].embeddings.clear();
      results[j].prompt_tokens = 0;
    }
    round[j]->promise.set_value(std::move(results[j]));
  }
}

}  // namespace tessera
