// engine/draft_model_drafter.cpp: DraftModelDrafter (see draft_model_drafter.h).
#include "engine/draft_model_drafter.h"

#include <algorithm>

#include "common/error.h"

namespace tessera {

namespace {

constexpr int32_t kDraftBlockSize = 16;
// A new sequence's prompt is fed in chunks of this many tokens: a step no larger than the engine's
// keeps the backend's step workspace, which captured graphs point into, from growing.
constexpr size_t kCatchUpChunk = 512;

GeneratorConfig draft_generator_config(int32_t kv_tokens) {
  TESSERA_CHECK(kv_tokens >= kDraftBlockSize, "draft model: its KV pool needs at least " << kDraftBlockSize
                                                                                        << " tokens, got " << kv_tokens);
  GeneratorConfig config;
  config.block_size = kDraftBlockSize;
  config.num_blocks = kv_tokens / kDraftBlockSize;
  config.prefix_caching = false;  // a rejected draft's positions are truncated away, cached blocks could not be
  return config;
}

}  // namespace

DraftModelDrafter::DraftModelDrafter(CausalLm& model, Backend& backend, int32_t kv_tokens)
    : model_(model), backend_(backend), generator_(model, backend, draft_generator_config(kv_tokens)) {}

std::vector<int32_t> DraftModelDrafter::propose(int64_t seq, std::span<const int32_t> tokens, int32_t max_tokens) {
  const DraftAsk ask{seq, tokens, max_tokens};
  return propose_all(std::span(&ask, 1))[0];
}

// Round r feeds every sequence still drafting its token r - 1 (round 0: what catch_up left) in one
// forward, so k drafts for a batch cost k forwards of the batch rather than k per sequence.
std::vector<std::vector<int32_t>> DraftModelDrafter::propose_all(std::span<const DraftAsk> asks) {
  std::vector<std::vector<int32_t>> drafts(asks.size());
  std::vector<std::span<const int32_t>> feeds(asks.size());  // what each still feeds; empty: no drafts
  try {
    for (size_t i = 0; i < asks.size(); ++i) {
      if (!fits(asks[i])) continue;
      drafts[i].reserve(static_cast<size_t>(asks[i].max_tokens));  // feeds point at their last element
      feeds[i] = catch_up(asks[i]);
    }
    for (int32_t round = 0;; ++round) {
      std::vector<Generator::SequenceInput> inputs;
      std::vector<size_t> owner;  // inputs[r] drafts for asks[owner[r]]
      for (size_t i = 0; i < asks.size(); ++i) {
        if (feeds[i].empty() || round >= asks[i].max_tokens) continue;
        inputs.push_back({asks[i].seq, feeds[i], &causal_});
        owner.push_back(i);
      }
      if (inputs.empty()) break;
      const std::vector<int32_t> next = greedy_next(inputs);
      for (size_t r = 0; r < owner.size(); ++r) {
        drafts[owner[r]].push_back(next[r]);
        feeds[owner[r]] = std::span<const int32_t>(&drafts[owner[r]].back(), 1);
      }
    }
  } catch (const Error&) {
    // The draft pool is full (or the step failed): no drafts this time, and the sequences start over.
    for (size_t i = 0; i < asks.size(); ++i) {
      if (!fits(asks[i])) continue;
      generator_.release(asks[i].seq);
      in_kv_.erase(asks[i].seq);
    }
    return std::vector<std::vector<int32_t>>(asks.size());
  }
  return drafts;
}

bool DraftModelDrafter::fits(const DraftAsk& ask) const {
  const int64_t context = model_.config().max_position_embeddings;
  return !ask.tokens.empty() && ask.max_tokens > 0 &&
         (context <= 0 || static_cast<int64_t>(ask.tokens.size()) + ask.max_tokens <= context);
}

std::span<const int32_t> DraftModelDrafter::catch_up(const DraftAsk& ask) {
  std::span<const int32_t> feed = follow(ask.seq, ask.tokens);
  for (; feed.size() > kCatchUpChunk; feed = feed.subspan(kCatchUpChunk)) {
    const Generator::SequenceInput input{ask.seq, feed.first(kCatchUpChunk), &causal_};
    feed_tokens(std::span(&input, 1));
  }
  return feed;
}

std::span<const int32_t> DraftModelDrafter::follow(int64_t seq, std::span<const int32_t> tokens) {
  std::vector<int32_t>& in_kv = in_kv_[seq];
  const auto kept = static_cast<size_t>(std::mismatch(in_kv.begin(), in_kv.end(), tokens.begin(), tokens.end()).first -
                                        in_kv.begin());
  const size_t keep = std::min(kept, tokens.size() - 1);  // the last token is fed again for its logits
  if (keep < in_kv.size()) {
    generator_.truncate(seq, static_cast<int64_t>(keep));
    in_kv.resize(keep);
  }
  return tokens.subspan(keep);
}

Tensor DraftModelDrafter::feed_tokens(std::span<const Generator::SequenceInput> inputs) {
  const Tensor logits = generator_.forward(inputs);
  for (const Generator::SequenceInput& input : inputs) {
    std::vector<int32_t>& in_kv = in_kv_[input.id];
    in_kv.insert(in_kv.end(), input.tokens.begin(), input.tokens.end());
  }
  return logits;
}

std::vector<int32_t> DraftModelDrafter::greedy_next(std::span<const Generator::SequenceInput> inputs) {
  const Tensor logits = feed_tokens(inputs);
  std::vector<int32_t> next;
  if (backend_.samples_on_device()) {
    for (const SampleOutcome& outcome : backend_.sample(logits, std::vector<SampleSpec>(inputs.size()))) {
      next.push_back(outcome.token);
    }
    return next;
  }
  const std::vector<float> rows = backend_.download(logits);
  const size_t vocab = rows.size() / inputs.size();
  for (size_t r = 0; r < inputs.size(); ++r) {
    const auto row = rows.begin() + static_cast<std::ptrdiff_t>(r * vocab);
    next.push_back(static_cast<int32_t>(std::max_element(row, row + static_cast<std::ptrdiff_t>(vocab)) - row));
  }
  return next;
}

void DraftModelDrafter::finished(int64_t seq, std::span<const int32_t>, int64_t) {
  generator_.release(seq);
  in_kv_.erase(seq);
}

}  // namespace tessera
