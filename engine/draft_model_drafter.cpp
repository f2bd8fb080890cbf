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
  const int64_t context = model_.config().max_position_embeddings;
  if (tokens.empty() || max_tokens <= 0 ||
      (context > 0 && static_cast<int64_t>(tokens.size()) + max_tokens > context)) {
    return {};
  }
  std::vector<int32_t> drafts;
  drafts.reserve(static_cast<size_t>(max_tokens));  // `feed` points at its last element
  try {
    std::span<const int32_t> feed = follow(seq, tokens);
    for (; feed.size() > kCatchUpChunk; feed = feed.subspan(kCatchUpChunk)) feed_tokens(seq, feed.first(kCatchUpChunk));
    for (int32_t i = 0; i < max_tokens; ++i) {
      drafts.push_back(greedy_next(seq, feed));
      feed = std::span<const int32_t>(&drafts.back(), 1);
    }
  } catch (const Error&) {
    // The draft pool is full (or the step failed): no drafts this time, and the sequence starts over.
    generator_.release(seq);
    in_kv_.erase(seq);
    return {};
  }
  return drafts;
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

Tensor DraftModelDrafter::feed_tokens(int64_t seq, std::span<const int32_t> feed) {
  const Generator::SequenceInput input{seq, feed, &causal_};
  const Tensor logits = generator_.forward(std::span(&input, 1));
  std::vector<int32_t>& in_kv = in_kv_[seq];
  in_kv.insert(in_kv.end(), feed.begin(), feed.end());
  return logits;
}

int32_t DraftModelDrafter::greedy_next(int64_t seq, std::span<const int32_t> feed) {
  const Tensor logits = feed_tokens(seq, feed);
  if (backend_.samples_on_device()) return backend_.sample(logits, std::vector<SampleSpec>(1))[0].token;
  const std::vector<float> row = backend_.download(logits);
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

void DraftModelDrafter::finished(int64_t seq, std::span<const int32_t>, int64_t) {
  generator_.release(seq);
  in_kv_.erase(seq);
}

}  // namespace tessera
