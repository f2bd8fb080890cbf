// engine/draft_model_drafter.h: DraftModelDrafter, drafts from a model that shares the target's
// tokenizer (a smaller one of its family): the draft model's greedy continuation, run through a
// Generator of its own (its own KV cache, on the target's backend or another). Each sequence's
// draft KV follows the target's tokens: what the target rejected is truncated away, what it kept is
// fed in, so a step costs the draft model one forward per draft token, and propose_all drafts every
// sequence's next token in one forward.
//
// Thread safety: none. The engine thread owns a Drafter.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/generation.h"
#include "engine/speculative/drafter.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/mask_policy.h"
#include "models/model.h"

namespace tessera {

class DraftModelDrafter final : public Drafter {
 public:
  // kv_tokens: the draft KV pool, shared by the sequences that speculate; a batch whose forward finds
  // it full gets no drafts that step, and its sequences start over.
  DraftModelDrafter(CausalLm& model, Backend& backend, int32_t kv_tokens);
  std::vector<int32_t> propose(int64_t seq, std::span<const int32_t> tokens, int32_t max_tokens) override;
  std::vector<std::vector<int32_t>> propose_all(std::span<const DraftAsk> asks) override;
  void finished(int64_t seq, std::span<const int32_t> tokens, int64_t prompt_size) override;

 private:
  // Brings the draft KV of `seq` to tokens[0, n - 1) and returns the tokens still to feed (at least
  // the last, whose logits give the first draft).
  std::span<const int32_t> follow(int64_t seq, std::span<const int32_t> tokens);
  // Runs each input's tokens through the draft model after what its draft KV holds; the logits of
  // each input's last token.
  Tensor feed_tokens(std::span<const Generator::SequenceInput> inputs);
  // Whether the model's context has room for the ask's tokens and drafts.
  bool fits(const DraftAsk& ask) const;
  // Brings the ask's draft KV up to all but its last token (a prompt fed in chunks); the tokens it
  // still has to feed.
  std::span<const int32_t> catch_up(const DraftAsk& ask);
  // The draft model's greedy token after each input's feed, in one forward.
  std::vector<int32_t> greedy_next(std::span<const Generator::SequenceInput> inputs);

  CausalLm& model_;
  Backend& backend_;
  Generator generator_;
  MaskPolicy causal_ = MaskPolicy::causal();
  std::unordered_map<int64_t, std::vector<int32_t>> in_kv_;  // per sequence: the tokens in its draft KV
};

}  // namespace tessera
