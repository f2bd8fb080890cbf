// engine/speculative/suffix_drafter.h: SuffixDrafter, after SuffixDecoding (arXiv 2411.04975): the
// guess is the most frequent continuation of the longest context the drafter has seen before, in
// the sequence's own prompt and output or in recent requests' outputs. Suits repetitive work
// (agent loops, templated answers) where whole passages recur across requests.
//
// Two indexes, both SuffixAutomaton (see suffix_automaton.h for why an automaton):
//  - per sequence: its prompt and output so far, extended by the tokens each propose() call adds;
//  - global: the outputs of the last finished requests, each followed by an end marker, so that
//    "the answer ended here" counts against guessing on.
//
// Memory bound. An automaton over n tokens holds at most 2n states and 3n transitions; a state is
// 40 bytes plus a heap block for its transitions (8 bytes each). Measured on random tokens (32k
// vocabulary, so nearly every state is new): about 130 bytes per token with the vectors' growth
// slack; the worst case is about 250. Per live sequence that is O(its tokens) (a 32k-token context:
// about 4 MB), plus 4 bytes per token for the copy that checks a call extends what was indexed. A
// sequence's index goes at finished(), so the engine must call finished() for every sequence it
// proposed for. The global index holds at most max_cached_outputs outputs of at most
// max_cached_output_tokens tokens each: with the defaults 256 x 1,024 tokens, 34 MB measured.
//
// Time. propose() costs O(max_match + max_tokens) lookups plus the appends of the tokens new since
// the last call (amortized O(max_match) each). Evicting rebuilds the global index, about 0.25 us per
// kept token on one core (up to ~65 ms with the defaults), once per max_cached_outputs / 8 finished
// requests.
//
// Thread safety: none (see Drafter).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/speculative/drafter.h"
#include "engine/speculative/suffix_automaton.h"

namespace tessera {

struct SuffixDrafterConfig {
  // The longest context matched, in tokens; longer repeats are followed at this length. >= 1.
  int32_t max_match = 32;
  // How many finished requests' outputs the global index keeps; the oldest go first. 0 learns
  // nothing across requests. >= 0.
  int32_t max_cached_outputs = 256;
  // Tokens kept of each cached output (its first ones), which bounds the global index. >= 1.
  int32_t max_cached_output_tokens = 1024;
  // A continuation is proposed only while it is at least this share of the times its context
  // continued, so weak guesses do not cost verification work. [0, 1].
  float min_share = 0.1f;
  // Throws tessera::Error naming the field.
  void validate() const;
};

class SuffixDrafter final : public Drafter {
 public:
  explicit SuffixDrafter(SuffixDrafterConfig config = {});

  std::vector<int32_t> propose(int64_t seq, std::span<const int32_t> tokens, int32_t max_tokens) override;
  void finished(int64_t seq, std::span<const int32_t> tokens, int64_t prompt_size) override;

  // The outputs the global index holds now, and the sequences with an index.
  size_t cached_outputs() const { return outputs_.size(); }
  size_t indexed_sequences() const { return sequences_.size(); }

 private:
  struct SequenceIndex {
    std::vector<int32_t> tokens;  // what `automaton` indexes
    SuffixAutomaton automaton;
  };

  SuffixAutomaton& sequence_index(int64_t seq, std::span<const int32_t> tokens);
  static bool extends(const std::vector<int32_t>& indexed, std::span<const int32_t> tokens);
  void cache_output(std::span<const int32_t> output);
  void append_to_global(std::span<const int32_t> output);

  SuffixDrafterConfig config_;
  std::unordered_map<int64_t, SequenceIndex> sequences_;
  std::deque<std::vector<int32_t>> outputs_;  // oldest first
  SuffixAutomaton global_;
};

}  // namespace tessera
