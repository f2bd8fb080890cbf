// engine/executor.cpp: Executor (see executor.h).
#include "engine/executor.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace tessera {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Per row: where its earlier rows start in the tensor of earlier rows (rows of all_logits rows
// before their last, in row order).
std::vector<size_t> first_earlier_rows(const StepPlan& plan) {
  std::vector<size_t> first(plan.rows.size());
  size_t at = 0;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    first[i] = at;
    if (plan.rows[i].all_logits) at += static_cast<size_t>(plan.rows[i].q_len() - 1);
  }
  return first;
}

// The most rows a step of one request's verify runs on the GEMV kernel that gives a row the bits it
// gets alone (the row-streaming kernel's limit); beyond, its rows go to the GEMM.
constexpr int32_t kOneRequestVerifyMaxRows = 8;

// The ladder with every batch size up to kOneRequestVerifyMaxRows on it. A speculating server's
// GEMVs give one request's rows the bits they get alone, on a kernel whose time grows with the rows,
// so that a verify of k drafts runs k + 1 rows instead of padding to the next power of two.
std::vector<int32_t> with_every_verify_size(std::vector<int32_t> ladder) {
  const int32_t top = std::min<int32_t>(kOneRequestVerifyMaxRows, ladder.back());
  for (int32_t batch = 1; batch <= top; ++batch) ladder.push_back(batch);
  std::sort(ladder.begin(), ladder.end());
  ladder.erase(std::unique(ladder.begin(), ladder.end()), ladder.end());
  return ladder;
}

}  // namespace

void WarmUpConfig::validate() const {
  TESSERA_CHECK(max_batch_tokens >= 1, "warm-up: max_batch_tokens must be >= 1, got " << max_batch_tokens);
  TESSERA_CHECK(max_batch_seqs >= 1, "warm-up: max_batch_seqs must be >= 1, got " << max_batch_seqs);
  TESSERA_CHECK(max_context >= 0, "warm-up: max_context must be >= 0 (0: the model's), got " << max_context);
}

Executor::Executor(CausalLm& model, Backend& backend, int32_t num_blocks, int32_t block_size,
                   std::span<const RankShard> followers)
    : model_(model), backend_(backend), block_size_(block_size), padding_block_(num_blocks) {
  const ModelConfig& mc = model_.config();
  cache_ = backend_.create_kv_cache(mc.num_layers, num_blocks + 1, block_size,
                                    static_cast<int32_t>(model_.cache_kv_heads()), static_cast<int32_t>(mc.head_dim));
  // Rank 0 leads the group's other ranks; every other rank is a follower (FollowerRanks).
  TESSERA_CHECK(backend_.tensor_parallel_rank() != 0 ||
                    static_cast<int32_t>(followers.size()) + 1 == backend_.tensor_parallel_size(),
                "executor: a model on rank 0 of " << backend_.tensor_parallel_size() << " ranks with "
                                                  << followers.size() << " other ranks");
  if (!followers.empty()) followers_ = std::make_unique<FollowerRanks>(followers, backend_, num_blocks, block_size);
}

StepResult Executor::execute(const StepPlan& plan) {
  const bool masked = start_grammar_masks(plan);
  Tensor all;
  try {
    all = forward_all(plan);
  } catch (...) {
    if (masked) grammar_masks_->wait();  // the workers read the plan's matchers
    throw;
  }
  const auto n = static_cast<int64_t>(plan.rows.size());
  const Tensor logits = all.first_rows(n), earlier = all.rows(n, all.dim(0) - n);
  StepResult result;
  result.sampled.resize(plan.rows.size());
  result.scores.resize(plan.rows.size());
  result.verified.resize(plan.rows.size());
  score(plan, logits, earlier, result);
  if (masked) {
    grammar_masks_->wait();
    result.grammar_mask_seconds = grammar_masks_->last_fill_seconds();
  }
  sample(plan, all, masked, result);
  return result;
}

bool Executor::start_grammar_masks(const StepPlan& plan) {
  const bool any = std::any_of(plan.rows.begin(), plan.rows.end(),
                               [](const StepRow& r) { return r.grammar != nullptr && r.sample.has_value(); });
  if (!any) return false;
  if (!grammar_masks_) grammar_masks_ = std::make_unique<GrammarMasks>(kGrammarMaskThreads);
  const auto words = static_cast<int32_t>((model_.config().vocab_size + 31) / 32);
  return grammar_masks_->start(plan, words);
}

Tensor Executor::forward(const StepPlan& plan, Tensor* earlier) {
  const Tensor all = forward_all(plan);
  const auto n = static_cast<int64_t>(plan.rows.size());
  const int64_t extra = all.dim(0) - n;
  TESSERA_CHECK(extra == 0 || earlier != nullptr, "executor: all_logits needs somewhere to put them");
  if (earlier != nullptr) *earlier = all.rows(n, extra);
  return all.first_rows(n);
}

Tensor Executor::forward_all(const StepPlan& plan) {
  TESSERA_CHECK(!plan.rows.empty(), "executor: a step with no rows");
  StepLayout layout = lay_out(plan);
  const auto rows = static_cast<int64_t>(layout.logit_rows.size());
  // A decode step is padded to the ladder's next batch size, whose graph warm_up captured. Its
  // logit rows are then every packed row in order, as a captured graph's are.
  const auto seqs = static_cast<int32_t>(layout.seqs.size());
  const bool decode_only = std::all_of(layout.seqs.begin(), layout.seqs.end(),
                                       [](const AttentionPlan::Sequence& s) { return s.q_len == 1; });
  if (decode_only && !decode_ladder_.empty() && seqs <= decode_ladder_.back()) {
    const int32_t padded = *std::lower_bound(decode_ladder_.begin(), decode_ladder_.end(), seqs);
    for (int32_t i = seqs; i < padded; ++i) {
      layout.seqs.push_back(padding_sequence(1, 1));
      layout.logit_rows.push_back(static_cast<int32_t>(layout.packed.size()));
      layout.packed.push_back(0);
    }
  }
  return run(plan.copies, layout.seqs, layout.packed, layout.logit_rows).first_rows(rows);
}

// Single-token sequences first (each decode's token and each verify row's last token, in row order,
// then the verify rows' earlier tokens), prompt chunks after them; the logit rows name each row's
// last token in row order, then the rows before the last of all_logits rows, in row order. A verify row's tokens become
// sequences of one query each, every one seeing the context up to itself as decoding them one by
// one would, so that a step of decodes and verifies stays a decode step: the GPU runs it through its
// decode kernel and replays it from a captured graph. Its KV is written before attention reads it,
// as a prompt chunk's is.
Executor::StepLayout Executor::lay_out(const StepPlan& plan) const {
  StepLayout layout;
  const size_t n = plan.rows.size();
  std::vector<int32_t> last(n), first_earlier(n, -1);
  auto add = [&](const StepRow& row, int32_t q_len, int64_t kv_len, size_t first_token) {
    TESSERA_CHECK(row.policy != nullptr, "executor: sequence " << row.seq << " has no mask policy");
    const auto at = static_cast<int32_t>(layout.packed.size());
    layout.packed.insert(layout.packed.end(), row.tokens.begin() + static_cast<std::ptrdiff_t>(first_token),
                         row.tokens.begin() + static_cast<std::ptrdiff_t>(first_token) + q_len);
    layout.seqs.push_back({.q_len = q_len, .kv_len = static_cast<int32_t>(kv_len), .policy = row.policy,
                           .block_table = row.block_table});
    return at;
  };
  for (size_t i = 0; i < n; ++i) {
    const StepRow& row = plan.rows[i];
    TESSERA_CHECK(row.q_len() >= 1, "executor: sequence " << row.seq << " has no tokens this step");
    if (row.q_len() == 1 || row.num_draft > 0) last[i] = add(row, 1, row.end(), row.tokens.size() - 1);
  }
  for (size_t i = 0; i < n; ++i) {
    const StepRow& row = plan.rows[i];
    if (row.num_draft == 0 || row.q_len() == 1) continue;
    for (int32_t j = 0; j + 1 < row.q_len(); ++j) {
      const int32_t at = add(row, 1, row.start + j + 1, static_cast<size_t>(j));
      if (j == 0) first_earlier[i] = at;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const StepRow& row = plan.rows[i];
    if (row.q_len() == 1 || row.num_draft > 0) continue;
    const int32_t at = add(row, row.q_len(), row.end(), 0);
    last[i] = at + row.q_len() - 1;
    if (row.all_logits) first_earlier[i] = at;
  }
  layout.logit_rows = last;
  for (size_t i = 0; i < n; ++i) {
    if (!plan.rows[i].all_logits) continue;
    for (int32_t j = 0; j + 1 < plan.rows[i].q_len(); ++j) layout.logit_rows.push_back(first_earlier[i] + j);
  }
  return layout;
}

Tensor Executor::run(std::span<const KvCopy> copies, std::span<const AttentionPlan::Sequence> seqs,
                     std::span<const int32_t> packed, std::span<const int32_t> logit_rows) {
  if (!followers_) return run_here(copies, seqs, packed, logit_rows);
  followers_->start([&](Executor& rank) { rank.run_here(copies, seqs, packed, logit_rows); });
  Tensor logits;
  try {
    logits = run_here(copies, seqs, packed, logit_rows);
  } catch (...) {
    if (const std::exception_ptr cause = followers_->abort_and_wait()) std::rethrow_exception(cause);
    throw;
  }
  followers_->wait();
  return logits;
}

Tensor Executor::run_here(std::span<const KvCopy> copies, std::span<const AttentionPlan::Sequence> seqs,
                          std::span<const int32_t> packed, std::span<const int32_t> logit_rows) {
  for (const KvCopy& copy : copies) model_.copy_kv(cache_, copy.src_slots, copy.dst_slots, copy.rotate_by);
  AttentionPlan plan = AttentionPlan::build(seqs, block_size_);
  ForwardBatch batch;
  batch.token_ids = packed;
  batch.device_token_ids = backend_.prepare_step(plan, packed);
  batch.plan = &plan;
  const std::span<const int32_t> rows = logit_rows.empty() ? std::span<const int32_t>(plan.last_rows()) : logit_rows;
  return backend_.run_step(&cache_, [&] { return model_.forward(batch, &cache_, rows); });
}

// Every row's sample and every verify row's draft checks in one sampling call: on the GPU that is
// one upload, one kernel and one wait a step, which a small model's verify step would otherwise
// pay twice. `all` holds each row's last-token logits, then the earlier rows; those are sampled too
// when a verify needs them.
void Executor::sample(const StepPlan& plan, const Tensor& all, bool masked, StepResult& result) {
  const auto any = [&](auto&& wants) { return std::any_of(plan.rows.begin(), plan.rows.end(), wants); };
  const bool any_sample = any([](const StepRow& r) { return r.sample.has_value(); });
  const bool any_verify = any([](const StepRow& r) { return r.num_draft > 0; });
  if (!any_sample && !any_verify) return;
  const size_t n = plan.rows.size();
  std::vector<SampleSpec> specs(n);  // rows that take no sample: a greedy placeholder
  for (size_t i = 0; i < n; ++i) {
    if (!plan.rows[i].sample) continue;
    specs[i] = *plan.rows[i].sample;
    if (masked) specs[i].allowed_tokens = grammar_masks_->mask(i);
  }
  if (any_verify) {
    const std::vector<SampleSpec> checks = verify_specs(plan, static_cast<size_t>(all.dim(0)) - n, masked);
    specs.insert(specs.end(), checks.begin(), checks.end());
  }
  std::vector<SampleOutcome> outcomes = sample_rows(all.first_rows(static_cast<int64_t>(specs.size())), specs);
  for (size_t i = 0; i < n; ++i) {
    if (plan.rows[i].sample) result.sampled[i] = std::move(outcomes[i]);
  }
  if (!any_verify) return;
  const std::vector<size_t> first = first_earlier_rows(plan);
  for (size_t i = 0; i < n; ++i) {
    if (plan.rows[i].num_draft == 0) continue;
    const auto at = std::make_move_iterator(outcomes.begin() + static_cast<std::ptrdiff_t>(n + first[i]));
    result.verified[i].assign(at, at + plan.rows[i].num_draft);
  }
}

std::vector<SampleOutcome> Executor::sample_rows(const Tensor& rows, std::span<const SampleSpec> specs) {
  if (backend_.samples_on_device()) return backend_.sample(rows, specs);
  std::vector<float> host = backend_.download(rows);
  const auto vocab = static_cast<size_t>(rows.dim(1));
  std::vector<SampleOutcome> outcomes;
  outcomes.reserve(specs.size());
  for (size_t r = 0; r < specs.size(); ++r) {
    outcomes.push_back(sample_on_host(std::span<float>(host).subspan(r * vocab, vocab), specs[r]));
  }
  return outcomes;
}

// A verify row's earlier rows take its sampling settings, each with its own draw: sampling the
// target at a draft's position and keeping the draft when the sample equals it is the speculative
// sampling rule for a draft that guesses one token (accepted with probability p(draft), else a
// token from p without it), so the output distribution is the model's.
std::vector<SampleSpec> Executor::verify_specs(const StepPlan& plan, size_t earlier_rows, bool masked) const {
  std::vector<SampleSpec> specs(earlier_rows);  // greedy placeholders
  const std::vector<size_t> first = first_earlier_rows(plan);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& row = plan.rows[i];
    if (row.num_draft == 0) continue;
    TESSERA_CHECK(row.all_logits && row.num_draft + 1 == row.q_len() && row.sample &&
                      (row.draft_uniforms.empty() || row.draft_uniforms.size() == static_cast<size_t>(row.num_draft)),
                  "executor: verify row of sequence " << row.seq << " must be its last token and the drafts");
    for (int32_t j = 0; j < row.num_draft; ++j) {
      SampleSpec& spec = specs[first[i] + static_cast<size_t>(j)];
      spec = *row.sample;
      spec.uniform = row.draft_uniforms.empty() ? 0.0 : row.draft_uniforms[static_cast<size_t>(j)];
      if (!row.draft_penalties.empty()) {
        spec.penalty_tokens = row.draft_penalties[static_cast<size_t>(j)].tokens;
        spec.penalty_counts = row.draft_penalties[static_cast<size_t>(j)].counts;
      }
      spec.allowed_tokens = masked ? grammar_masks_->mask(i, j) : std::span<const int32_t>();
    }
  }
  return specs;
}

void Executor::score(const StepPlan& plan, const Tensor& logits, const Tensor& earlier, StepResult& result) {
  const bool any = std::any_of(plan.rows.begin(), plan.rows.end(), [](const StepRow& r) { return r.scores.has_value(); });
  if (!any) return;
  const std::vector<float> before =
      earlier.defined() && earlier.dim(0) > 0 ? backend_.download(earlier) : std::vector<float>();
  const auto vocab = static_cast<size_t>(logits.dim(1));
  const std::vector<size_t> first_earlier = first_earlier_rows(plan);  // each row's first row in `before`
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& row = plan.rows[i];
    const auto q = static_cast<size_t>(row.q_len());
    if (row.scores) {
      const RowScores& wanted = *row.scores;
      std::vector<float> last;
      for (size_t k = 0; k < wanted.targets.size(); ++k) {
        const size_t r = static_cast<size_t>(wanted.first_row) + k;
        TESSERA_CHECK(r < q && (row.all_logits || r + 1 == q),
                      "executor: sequence " << row.seq << " asks for scores of row " << r << " without its logits");
        std::span<const float> row_logits;
        if (r + 1 < q) {
          row_logits = std::span<const float>(before).subspan((first_earlier[i] + r) * vocab, vocab);
        } else {
          last = backend_.download(logits.rows(static_cast<int64_t>(i), 1));
          row_logits = last;
        }
        result.scores[i].push_back(score_token(row_logits, wanted.targets[k], wanted.top_n));
      }
    }
  }
}

AttentionPlan::Sequence Executor::padding_sequence(int32_t q_len, int32_t kv_len) const {
  const size_t blocks = static_cast<size_t>((kv_len + block_size_ - 1) / block_size_);
  TESSERA_CHECK(blocks <= padding_table_.size(), "executor: a padding sequence of " << kv_len
                                                     << " tokens is longer than the warm-up context");
  AttentionPlan::Sequence s;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.policy = &padding_policy_;
  s.block_table = std::span<const int32_t>(padding_table_).first(blocks);
  return s;
}

WarmUpReport Executor::warm_up(const WarmUpConfig& config) {
  config.validate();
  WarmUpReport report;
  if (!backend_.sizes_workspace_at_start()) return report;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t model_context = model_.config().max_position_embeddings;
  const int32_t context = static_cast<int32_t>(config.max_context > 0 ? config.max_context : model_context);
  TESSERA_CHECK(context >= 1, "warm-up: max_context is 0 and the model gives no max_position_embeddings");
  const int32_t max_seqs = std::min(config.max_batch_seqs, config.max_batch_tokens);
  padding_table_.assign(static_cast<size_t>((context + block_size_ - 1) / block_size_), padding_block_);

  Tensor last;
  // The largest step: one prompt chunk that sees the whole context beside the most decode rows.
  {
    std::vector<AttentionPlan::Sequence> seqs;
    const int32_t chunk = std::min(config.max_batch_tokens - (max_seqs - 1), context);
    seqs.push_back(padding_sequence(chunk, context));
    for (int32_t i = 1; i < max_seqs; ++i) seqs.push_back(padding_sequence(1, 1));
    const std::vector<int32_t> tokens(static_cast<size_t>(chunk + max_seqs - 1), 0);
    last = run({}, seqs, tokens);
  }

  // Decode shapes, largest first, so that the first one sizes the buffers every graph points into.
  decode_ladder_ = backend_.decode_batch_ladder(max_seqs);
  if (config.verify_shapes && !decode_ladder_.empty()) decode_ladder_ = with_every_verify_size(std::move(decode_ladder_));
  const int32_t max_blocks = static_cast<int32_t>(padding_table_.size());
  std::vector<int32_t> widths;
  for (int32_t w = 1;; w *= 2) {
    widths.push_back(std::min(w, max_blocks));
    if (w >= max_blocks) break;
  }
  // Each batch once at the widest table first, eagerly: the decode workspace is sized now, not by
  // a later shape after graphs were captured (a batch-invariant decode may give a small batch more
  // splits than a large one).
  for (const int32_t batch : decode_ladder_) last = warm_up_decode_step(batch, widths.back(), WarmUpRows::kDecodes);
  for (auto batch = decode_ladder_.rbegin(); batch != decode_ladder_.rend(); ++batch) {
    for (auto width = widths.rbegin(); width != widths.rend(); ++width) {
      for (const WarmUpRows rows : {WarmUpRows::kDecodes, WarmUpRows::kVerifies, WarmUpRows::kOneRequestVerify}) {
        if (rows != WarmUpRows::kDecodes && !config.verify_shapes) continue;
        if (rows == WarmUpRows::kVerifies && *batch < 3) continue;  // two rows with a verify are one request's
        if (rows == WarmUpRows::kOneRequestVerify && (*batch < 2 || *batch > kOneRequestVerifyMaxRows)) continue;
        for (int pass = 0; pass < 2; ++pass) last = warm_up_decode_step(*batch, *width, rows);
        ++report.decode_shapes;
      }
    }
  }
  backend_.download(last.first_rows(1));  // waits for the last step to finish
  report.decode_batches = decode_ladder_;
  if (config.verify_shapes) report.decode_step_seconds = time_decode_steps();
  report.seconds = seconds_since(t0);
  return report;
}

// All rows in the padding block, the first over `width` blocks. Verifies of several requests: rows
// of one and two keys, so that the two-key rows read a key another row writes. One request's
// verify: a chain whose row i reads the keys of the i rows before it, as its tokens do.
Tensor Executor::warm_up_decode_step(int32_t batch, int32_t width, WarmUpRows rows) {
  const int32_t first = (width - 1) * block_size_ + 1;
  std::vector<AttentionPlan::Sequence> seqs;
  for (int32_t i = 0; i < batch; ++i) {
    if (rows == WarmUpRows::kOneRequestVerify) {
      seqs.push_back(padding_sequence(1, first + i));
    } else {
      seqs.push_back(padding_sequence(1, i == 0 ? first : (rows == WarmUpRows::kVerifies ? 1 + i % 2 : 1)));
    }
  }
  return run({}, seqs, std::vector<int32_t>(static_cast<size_t>(batch), 0));
}

// Each ladder size's captured step at a one-block table, as a step with drafts runs it (one
// request's verify up to 8 rows, several requests' beyond): the best of three rounds of kTimedSteps
// back to back.
std::vector<double> Executor::time_decode_steps() {
  constexpr int kTimedSteps = 4;
  std::vector<double> best(decode_ladder_.size(), 1e30);
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < decode_ladder_.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const int32_t batch = decode_ladder_[i];
      Tensor last;
      const WarmUpRows rows = batch == 1                          ? WarmUpRows::kDecodes
                              : batch <= kOneRequestVerifyMaxRows ? WarmUpRows::kOneRequestVerify
                                                                  : WarmUpRows::kVerifies;
      for (int step = 0; step < kTimedSteps; ++step) last = warm_up_decode_step(batch, 1, rows);
      backend_.download(last.first_rows(1));
      best[i] = std::min(best[i], seconds_since(t0) / kTimedSteps);
    }
  }
  return best;
}

}  // namespace tessera
