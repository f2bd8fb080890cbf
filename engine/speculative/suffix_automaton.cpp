// engine/speculative/suffix_automaton.cpp: SuffixAutomaton, the online construction (Blumer et al.)
// with occurrence counts kept on the short-context tail of the suffix-link path.
#include "engine/speculative/suffix_automaton.h"

#include <algorithm>

namespace tessera {

SuffixAutomaton::SuffixAutomaton(int32_t max_context) : max_context_(max_context) {
  add_state(/*length=*/0, /*link=*/-1, /*count=*/0);
}

int32_t SuffixAutomaton::target(int32_t state, int32_t token) const {
  const std::vector<Transition>& ts = states_[state].transitions;
  auto it = std::ranges::lower_bound(ts, token, {}, &Transition::token);
  return it != ts.end() && it->token == token ? it->target : -1;
}

void SuffixAutomaton::set_target(int32_t state, int32_t token, int32_t target) {
  std::vector<Transition>& ts = states_[state].transitions;
  auto it = std::ranges::lower_bound(ts, token, {}, &Transition::token);
  if (it != ts.end() && it->token == token) {
    it->target = target;
    return;
  }
  ts.insert(it, Transition{token, target});
  ++transitions_;
}

// The state on `state`'s suffix-link path that holds its suffix of `length` tokens (length must not
// exceed the state's own).
int32_t SuffixAutomaton::state_holding(int32_t state, int32_t length) const {
  while (state != 0 && states_[states_[state].link].length >= length) state = states_[state].link;
  return state;
}

int32_t SuffixAutomaton::add_state(int32_t length, int32_t link, int32_t count) {
  states_.push_back(State{length, link, count, {}});
  return static_cast<int32_t>(states_.size() - 1);
}

// The textbook construction. A clone takes over the shorter strings of a state q, so it starts
// with q's count; the caller then counts the new end position.
void SuffixAutomaton::extend(int32_t token) {
  const int32_t cur = add_state(states_[last_].length + 1, 0, 0);
  int32_t p = last_;
  while (p != -1 && target(p, token) == -1) {
    set_target(p, token, cur);
    p = states_[p].link;
  }
  if (p != -1) {
    const int32_t q = target(p, token);
    if (states_[p].length + 1 == states_[q].length) {
      states_[cur].link = q;
    } else {
      const int32_t clone = add_state(states_[p].length + 1, states_[q].link, states_[q].count);
      states_[clone].transitions = states_[q].transitions;
      transitions_ += states_[clone].transitions.size();
      while (p != -1 && target(p, token) == q) {
        set_target(p, token, clone);
        p = states_[p].link;
      }
      states_[q].link = clone;
      states_[cur].link = clone;
    }
  }
  last_ = cur;
}

void SuffixAutomaton::append(int32_t token) {
  // The text's last (up to) max_context tokens, which the new token extends to the new tail.
  const int32_t kept = std::min(tail_length_, max_context_);
  int32_t tail = state_holding(tail_, kept);
  extend(token);
  // A clone made by extend() may now hold those tokens instead of their old state.
  tail = state_holding(tail, kept);
  tail_ = target(tail, token);
  tail_length_ = kept + 1;
  ++size_;
  // Every state on the path from the tail holds a suffix of the text of at most max_context + 1
  // tokens, so each gains this end position; the states above it hold longer strings only.
  for (int32_t s = tail_; s != -1; s = states_[s].link) ++states_[s].count;
}

SuffixAutomaton::Match SuffixAutomaton::longest_repeated_suffix() const {
  int32_t length = std::min(tail_length_, max_context_);
  int32_t state = state_holding(tail_, length);
  // A state's strings end at the same places, so a state without transitions ends only at the
  // text's end; its suffixes in the next state down the path end elsewhere too, or not at all.
  while (state != 0 && states_[state].transitions.empty()) {
    state = states_[state].link;
    length = states_[state].length;
  }
  return state == 0 ? Match{} : Match{state, length};
}

SuffixAutomaton::Match SuffixAutomaton::longest_suffix_in(std::span<const int32_t> context) const {
  Match match;
  for (int32_t token : context.last(std::min(context.size(), static_cast<size_t>(max_context_)))) {
    while (match.state != 0 && target(match.state, token) == -1) {
      match.state = states_[match.state].link;
      match.length = states_[match.state].length;
    }
    const int32_t next = target(match.state, token);
    match = next == -1 ? Match{} : Match{next, match.length + 1};
  }
  return match;
}

std::vector<int32_t> SuffixAutomaton::continue_greedily(Match match, int32_t max_tokens, double min_share) const {
  std::vector<int32_t> tokens;
  while (match.length > 0 && static_cast<int32_t>(tokens.size()) < max_tokens) {
    // Each transition's target holds the context followed by its token, so its count is how often
    // the context continued that way; ties go to the smaller token, to be deterministic.
    const Transition* best = nullptr;
    int64_t best_count = 0, total = 0;
    for (const Transition& t : states_[match.state].transitions) {
      const int32_t count = states_[t.target].count;
      total += count;
      if (count > best_count) best = &t, best_count = count;
    }
    if (best == nullptr || best->token < 0) break;
    if (static_cast<double>(best_count) < min_share * static_cast<double>(total)) break;
    tokens.push_back(best->token);
    match = Match{best->target, match.length + 1};
    if (match.length > max_context_) match = Match{state_holding(match.state, max_context_), max_context_};
  }
  return tokens;
}

}  // namespace tessera
