// models/tokenizer/chat_template.cpp: ChatML, Llama-2, Mistral [INST] and Llama-3 chat templates,
// rendered exactly as their reference Jinja sources do.
#include "models/tokenizer/chat_template.h"

#include <array>

#include "common/error.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera {
namespace {

struct NamedKind {
  const char* name;
  ChatTemplateKind kind;
};
constexpr std::array<NamedKind, 4> kKinds{{{"chatml", ChatTemplateKind::kChatML},
                                           {"llama2", ChatTemplateKind::kLlama2},
                                           {"mistral", ChatTemplateKind::kMistral},
                                           {"llama3", ChatTemplateKind::kLlama3}}};

// Python's str.strip() (Jinja's `trim` and `.strip()`): Unicode whitespace plus U+001C..U+001F.
std::string python_strip(const std::string& s) {
  const auto cps = unicode::to_code_points(s);
  const auto space = [](char32_t c) { return unicode::is_white_space(c) || (c >= 0x1C && c <= 0x1F); };
  size_t begin = 0, end = cps.size();
  while (begin < end && space(cps[begin])) ++begin;
  while (end > begin && space(cps[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) unicode::append_utf8(out, cps[i]);
  return out;
}

void check_alternation(const std::vector<ChatMessage>& messages, size_t first, const char* template_name) {
  for (size_t i = first; i < messages.size(); ++i) {
    const bool want_user = (i - first) % 2 == 0;
    const std::string& role = messages[i].role;
    TESSERA_CHECK(role == "user" || role == "assistant",
                  "messages[" << i << "].role is '" << role << "'; the " << template_name
                              << " template only takes user and assistant messages"
                              << (first == 1 ? " after a leading system message" : ""));
    TESSERA_CHECK((role == "user") == want_user, "messages[" << i << "].role is '" << role << "'; the " << template_name
                                                             << " template needs roles to alternate user/assistant");
  }
}

std::string render_chatml(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  if (!t.default_system_prompt.empty() && (messages.empty() || messages[0].role != "system")) {
    // SmolLM2's template adds it inside its loop, so it only appears when there is a message.
    if (!messages.empty()) out += "<|im_start|>system\n" + t.default_system_prompt + "<|im_end|>\n";
  }
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama2(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos) {
  // The reference template reads messages[0] unconditionally.
  TESSERA_CHECK(!messages.empty(), "messages is empty; the llama2 template needs at least one message");
  const bool has_system = messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  check_alternation(messages, first, "llama2");
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    std::string content = messages[i].content;
    if (i == first && has_system) content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content;
    if (messages[i].role == "user") {
      out += bos + "[INST] " + python_strip(content) + " [/INST]";
    } else {
      out += " " + python_strip(content) + " " + eos;
    }
  }
  return out;
}

std::string render_mistral(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos) {
  check_alternation(messages, 0, "mistral");
  std::string out = bos;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "user") {
      out += "[INST] " + messages[i].content + " [/INST]";
    } else {
      out += messages[i].content + eos;
    }
  }
  return out;
}

std::string render_llama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& bos) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += bos;
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" + python_strip(messages[i].content) +
           "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// The text of a literal system turn the template emits when messages[0] is not a system message,
// e.g. SmolLM2's "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n...".
std::string default_system_prompt_of(const std::string& src) {
  const bool conditional = src.find("!= 'system'") != std::string::npos || src.find("!= \"system\"") != std::string::npos;
  if (!conditional) return {};
  for (const std::string head : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    const size_t at = src.find(head);
    if (at == std::string::npos) continue;
    const size_t begin = at + head.size();
    const size_t end = src.find("<|im_end|>", begin);
    if (end == std::string::npos) return {};
    std::string prompt = src.substr(begin, end - begin);
    // A prompt built from variables ("' + system_message + '") is not a literal default.
    if (prompt.find('\'') != std::string::npos || prompt.find('"') != std::string::npos ||
        prompt.find("{{") != std::string::npos) {
      return {};
    }
    if (head.ends_with("\\n")) {
      std::string unescaped;
      for (size_t i = 0; i < prompt.size(); ++i) {
        if (prompt[i] == '\\' && i + 1 < prompt.size() && prompt[i + 1] == 'n') {
          unescaped += '\n';
          ++i;
        } else {
          unescaped += prompt[i];
        }
      }
      prompt = std::move(unescaped);
    }
    return prompt;
  }
  return {};
}

}  // namespace

const char* chat_template_name(ChatTemplateKind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

ChatTemplateKind chat_template_from_name(const std::string& name) {
  for (const auto& k : kKinds) {
    if (name == k.name) return k.kind;
  }
  std::string known;
  for (const auto& k : kKinds) known += (known.empty() ? "" : ", ") + std::string(k.name);
  TESSERA_FAIL("unknown chat template '" << name << "' (known: " << known << ")");
}

std::optional<ChatTemplate> detect_chat_template_details(const std::string& src) {
  if (src.find("<|im_start|>") != std::string::npos) {
    return ChatTemplate{ChatTemplateKind::kChatML, default_system_prompt_of(src)};
  }
  if (src.find("<|start_header_id|>") != std::string::npos) return ChatTemplate{ChatTemplateKind::kLlama3, {}};
  if (src.find("<<SYS>>") != std::string::npos) return ChatTemplate{ChatTemplateKind::kLlama2, {}};
  if (src.find("[INST]") != std::string::npos) return ChatTemplate{ChatTemplateKind::kMistral, {}};
  return std::nullopt;
}

std::optional<ChatTemplateKind> detect_chat_template(const std::string& jinja_source) {
  const auto details = detect_chat_template_details(jinja_source);
  return details ? std::optional<ChatTemplateKind>(details->kind) : std::nullopt;
}

std::string apply_chat_template(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_token, const std::string& eos_token) {
  switch (t.kind) {
    case ChatTemplateKind::kChatML: return render_chatml(t, messages, add_generation_prompt);
    case ChatTemplateKind::kLlama2: return render_llama2(messages, bos_token, eos_token);
    case ChatTemplateKind::kMistral: return render_mistral(messages, bos_token, eos_token);
    case ChatTemplateKind::kLlama3: return render_llama3(messages, add_generation_prompt, bos_token);
  }
  TESSERA_FAIL("unknown chat template kind " << static_cast<int>(t.kind));
}

std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_token, const std::string& eos_token) {
  return apply_chat_template(ChatTemplate{kind, {}}, messages, add_generation_prompt, bos_token, eos_token);
}

}  // namespace tessera
