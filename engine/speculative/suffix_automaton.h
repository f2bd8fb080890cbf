// engine/speculative/suffix_automaton.h: SuffixAutomaton, an index of every substring of a token
// text that grows one token at a time, with each substring's occurrence count: the index behind
// SuffixDrafter.
//
// Why an automaton and not a suffix trie: a trie over windows of depth D holds up to D nodes per
// token (33 per token for 32-token contexts), while the automaton holds at most 2 states and 3
// transitions per token whatever the context length, and it is built online (amortized O(1) per
// token), which suits a sequence that grows between calls. What it cannot do is forget: removing
// text means building it again.
//
// Counts: a state's count is the number of places its strings end in the text. Keeping every count
// exact would walk the whole suffix-link path per token, which is the text's length for a model
// stuck repeating one token. Counts are kept exact only for states holding a string of at most
// max_context + 1 tokens: those are the tail of the path (at most max_context + 2 states), reached
// from a pointer to the state of the text's last max_context + 1 tokens. Queries here never read
// another state's count: contexts are at most max_context tokens, continuations one more.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

class SuffixAutomaton {
 public:
  // A context found in the text: the state holding it and its length in tokens (0: no context).
  struct Match {
    int32_t state = 0;
    int32_t length = 0;
  };

  // Contexts of up to max_context tokens are matched and counted exactly. >= 1.
  explicit SuffixAutomaton(int32_t max_context);

  // Appends one token. Negative tokens are end markers: a continuation never proposes one, but it
  // counts as a vote for "the text ended here".
  void append(int32_t token);
  int64_t size() const { return size_; }

  // The longest suffix of the text (at most max_context tokens) that also occurs earlier with a
  // token after it: the text's own repeats.
  Match longest_repeated_suffix() const;
  // The longest suffix of `context` (at most max_context tokens) that occurs in the text.
  Match longest_suffix_in(std::span<const int32_t> context) const;
  // Up to max_tokens tokens after `match`, each the most frequent continuation of the context so far
  // (the last max_context tokens of it), stopping before a continuation whose share of the
  // context's continuations is below min_share, or an end marker.
  std::vector<int32_t> continue_greedily(Match match, int32_t max_tokens, double min_share) const;

  // States and transitions held, for the memory bound.
  size_t state_count() const { return states_.size(); }
  size_t transition_count() const { return transitions_; }

 private:
  struct Transition {
    int32_t token;
    int32_t target;
  };
  struct State {
    int32_t length;  // of its longest string
    int32_t link;    // the state of its longest suffix held elsewhere; -1 for the root
    int32_t count;   // exact when the state holds a string of at most max_context + 1 tokens
    std::vector<Transition> transitions;  // sorted by token; most states have one or two
  };

  int32_t target(int32_t state, int32_t token) const;
  void set_target(int32_t state, int32_t token, int32_t target);
  int32_t state_holding(int32_t state, int32_t length) const;
  int32_t add_state(int32_t length, int32_t link, int32_t count);
  void extend(int32_t token);

  int32_t max_context_;
  std::vector<State> states_;
  int32_t last_ = 0;         // the state of the whole text
  int32_t tail_ = 0;         // the state of the text's last tail_length_ tokens
  int32_t tail_length_ = 0;  // min(size, max_context + 1)
  int64_t size_ = 0;
  size_t transitions_ = 0;
};

}  // namespace tessera
