// engine/speculative/speculative_config.h: SpeculativeConfig, which drafter a served LM speculates
// with and how far, and make_drafter, which builds it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/speculative/draft_budget.h"
#include "engine/speculative/drafter.h"
#include "engine/speculative/ngram_drafter.h"
#include "engine/speculative/suffix_drafter.h"

namespace tessera {

struct SpeculativeConfig {
  // none | ngram (prompt lookup) | suffix (suffix decoding) | draft_model (a smaller model's greedy
  // tokens: the served LM brings the model, EngineLoop::ServedLm::draft_model)
  std::string method = "none";
  int32_t num_speculative_tokens = 4;   // drafts a sequence has verified per step, at most; >= 1
  // No sequence speculates in a step with more running sequences than this (0: no limit). On the
  // H100 with SmolLM2, n-gram drafts paid at 8 clients and cost up to 8% at 64, where the sequences
  // that still ran below 32 speculated (bench/results/2026-11-27-h100-speculative).
  int32_t disable_by_batch_size = 8;
  // What a draft row costs where the backend times no decode steps (the CPU), as a share of the
  // step's fixed part, which reads the weights; 0: rows cost nothing and every draft is verified.
  double untimed_row_cost = StepCosts::kUntimedRowShare;
  NgramDrafterConfig ngram;             // method ngram: the suffix lengths looked up
  SuffixDrafterConfig suffix;           // method suffix: match length, the cache of recent outputs
  std::string draft_model;              // method draft_model: the draft's model path (the server loads it)
  int32_t draft_kv_tokens = 65536;      // method draft_model: the draft's KV pool, shared by the sequences
  bool enabled() const { return method != "none"; }
  void validate() const;                // throws naming the field
};

// The drafter config.method names; null for "none", and for "draft_model", whose drafter needs a
// loaded model (DraftModelDrafter, built by the engine).
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config);

}  // namespace tessera
