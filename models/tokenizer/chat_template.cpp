// models/tokenizer/chat_template.cpp: ChatML, Llama-2, Mistral [INST] and Llama-3 chat templates,
// with the tool-calling forms of Llama 3.1, Mistral v0.3 and Qwen2.5, rendered exactly as their
// reference Jinja sources do under transformers.
#include "models/tokenizer/chat_template.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/tokenizer/tokenizer.h"
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

using OrderedJson = nlohmann::ordered_json;

bool has_tool_turns(const std::vector<ChatMessage>& messages) {
  for (const auto& m : messages) {
    if (!m.tool_calls.empty() || m.role == "tool" || m.role == "ipython") return true;
  }
  return false;
}

// Python's json.dumps(x, ensure_ascii=False, indent=indent) as transformers' tojson calls it: keys
// in their order, ", " between items without indent, "," + newline with it, ": " after keys.
void write_python_json(const OrderedJson& j, int indent, int depth, std::string& out) {
  if (!j.is_object() && !j.is_array()) {
    out += j.dump();
    return;
  }
  const bool object = j.is_object();
  if (j.empty()) {
    out += object ? "{}" : "[]";
    return;
  }
  out += object ? '{' : '[';
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out += indent > 0 ? "," : ", ";
    first = false;
    if (indent > 0) out += '\n' + std::string(static_cast<size_t>((depth + 1) * indent), ' ');
    if (object) out += OrderedJson(it.key()).dump() + ": ";
    write_python_json(*it, indent, depth + 1, out);
  }
  if (indent > 0) out += '\n' + std::string(static_cast<size_t>(depth * indent), ' ');
  out += object ? '}' : ']';
}

std::string python_json(const OrderedJson& j, int indent = 0) {
  std::string out;
  write_python_json(j, indent, 0, out);
  return out;
}

OrderedJson parse_json_text(const std::string& text, const std::string& what) {
  // An empty arguments string is how some clients write a call without arguments.
  if (text.empty()) return OrderedJson::object();
  try {
    return OrderedJson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL(what << " is not valid JSON: " << e.what());
  }
}

OrderedJson call_arguments(const ToolCall& call) {
  return parse_json_text(call.arguments, "the arguments of tool call '" + call.name + "'");
}

// The OpenAI tools[i] object transformers hands the template: {"type", "function": {"name",
// "description", "parameters"}}, absent fields left out.
OrderedJson tool_json(const ToolDefinition& tool) {
  OrderedJson function = OrderedJson::object();
  function["name"] = tool.name;
  if (!tool.description.empty()) function["description"] = tool.description;
  if (!tool.parameters.empty()) {
    function["parameters"] = parse_json_text(tool.parameters, "the parameters of tool '" + tool.name + "'");
  }
  OrderedJson wrapped = OrderedJson::object();
  wrapped["type"] = "function";
  wrapped["function"] = std::move(function);
  return wrapped;
}

std::string chatml_turn(const std::string& role, const std::string& content) {
  return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
}

constexpr const char* kHermesToolsHead =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr const char* kHermesToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

std::string chatml_system_turn(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                               const std::vector<ToolDefinition>& tools) {
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (tools.empty()) {
    if (first_is_system) return chatml_turn("system", messages[0].content);
    // SmolLM2's template adds its default inside its loop, so it only appears when there is a message.
    return t.default_system_prompt.empty() || messages.empty() ? "" : chatml_turn("system", t.default_system_prompt);
  }
  std::string out = "<|im_start|>system\n" + (first_is_system ? messages[0].content : t.default_system_prompt);
  out += kHermesToolsHead;
  for (const auto& tool : tools) out += "\n" + python_json(tool_json(tool));
  return out + kHermesToolsTail;
}

std::string chatml_tool_calls_turn(const ChatMessage& m) {
  std::string out = "<|im_start|>" + m.role;
  if (!m.content.empty()) out += "\n" + m.content;
  for (const auto& call : m.tool_calls) {
    out += "\n<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " + python_json(call_arguments(call)) +
           "}\n</tool_call>";
  }
  return out + "<|im_end|>\n";
}

// Consecutive tool results share one user turn, each in <tool_response> tags.
std::string chatml_tool_result(const std::vector<ChatMessage>& messages, size_t i) {
  std::string out;
  if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n" + messages[i].content + "\n</tool_response>";
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
  return out;
}

std::string render_chatml(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                          const std::vector<ToolDefinition>& tools, bool add_generation_prompt) {
  // Qwen2.5's template reads messages[0] unconditionally.
  TESSERA_CHECK(t.variant != ChatTemplateVariant::kQwen25 || !messages.empty(),
                "messages is empty; this chatml template needs at least one message");
  std::string out = chatml_system_turn(t, messages, tools);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && m.role == "system") continue;  // written as the system turn
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      out += chatml_tool_calls_turn(m);
    } else if (m.role == "tool") {
      out += chatml_tool_result(messages, i);
    } else {
      out += chatml_turn(m.role, m.content);
    }
  }
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

// Mistral v0.3 checks alternation on user and assistant text turns only; calls and results sit
// between them freely.
void check_mistral_v3_alternation(const std::vector<ChatMessage>& messages, size_t first) {
  size_t turn = 0;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool" || m.role == "tool_results" || !m.tool_calls.empty()) continue;
    TESSERA_CHECK((m.role == "user") == (turn % 2 == 0),
                  "messages[" << i << "].role is '" << m.role
                              << "'; the mistral template needs user and assistant messages to alternate after an "
                                 "optional system message (tool calls and results aside)");
    ++turn;
  }
}

// The template writes string fields raw between quotes and the rest through tojson.
std::string mistral_available_tools(const std::vector<ToolDefinition>& tools) {
  std::string out = "[AVAILABLE_TOOLS] [";
  for (size_t i = 0; i < tools.size(); ++i) {
    const OrderedJson function = tool_json(tools[i])["function"];
    out += "{\"type\": \"function\", \"function\": {\"name\": \"" + tools[i].name + "\"";
    if (!tools[i].description.empty()) out += ", \"description\": \"" + tools[i].description + "\"";
    if (function.contains("parameters")) out += ", \"parameters\": " + python_json(function["parameters"]);
    out += "}}";
    out += i + 1 < tools.size() ? ", " : "]";
  }
  return out + "[/AVAILABLE_TOOLS]";
}

std::string mistral_tool_calls(const ChatMessage& m, const std::string& eos) {
  std::string out = "[TOOL_CALLS] [";
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ToolCall& call = m.tool_calls[i];
    out += "{\"name\": " + python_json(call.name) + ", \"arguments\": " + python_json(call_arguments(call)) +
           ", \"id\": \"" + mistral_tool_call_id(call.id) + "\"}";
    out += i + 1 < m.tool_calls.size() ? ", " : "]" + eos;
  }
  return out;
}

std::string render_mistral_v3(const std::vector<ChatMessage>& messages, const std::vector<ToolDefinition>& tools,
                              const std::string& bos, const std::string& eos) {
  TESSERA_CHECK(!messages.empty(), "messages is empty; the mistral template needs at least one message");
  const bool has_system = messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  check_mistral_v3_alternation(messages, first);
  // The template offers the tools before the user message equal to the last one.
  const std::string* last_user = nullptr;
  for (size_t i = first; i < messages.size(); ++i) {
    if (messages[i].role == "user") last_user = &messages[i].content;
  }
  std::string out = bos;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      if (!tools.empty() && m.content == *last_user) out += mistral_available_tools(tools);
      const bool with_system = has_system && i + 1 == messages.size();
      out += "[INST] " + (with_system ? messages[0].content + "\n\n" : "") + m.content + "[/INST]";
    } else if (!m.tool_calls.empty()) {
      out += mistral_tool_calls(m, eos);
    } else if (m.role == "assistant") {
      out += " " + python_strip(m.content) + eos;
    } else if (m.role == "tool" || m.role == "tool_results") {
      out += "[TOOL_RESULTS] {\"content\": " + m.content + ", \"call_id\": \"" + mistral_tool_call_id(m.tool_call_id) +
             "\"}[/TOOL_RESULTS]";
    } else {
      TESSERA_FAIL("messages[" << i << "].role is '" << m.role
                               << "'; the mistral template takes user, assistant and tool messages after an optional "
                                  "system message");
    }
  }
  return out;
}

std::string llama3_header(const std::string& role) { return "<|start_header_id|>" + role + "<|end_header_id|>\n\n"; }

constexpr const char* kLlama31ToolsPreamble =
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.Do not use variables.\n\n";

std::string llama31_message(const std::vector<ChatMessage>& messages, size_t i) {
  const ChatMessage& m = messages[i];
  if (!m.tool_calls.empty()) {
    TESSERA_CHECK(m.tool_calls.size() == 1, "messages[" << i << "] has " << m.tool_calls.size()
                                                        << " tool calls; the llama3 template takes one call per message");
    const ToolCall& call = m.tool_calls[0];
    return llama3_header("assistant") + "{\"name\": \"" + call.name + "\", \"parameters\": " +
           python_json(call_arguments(call)) + "}<|eot_id|>";
  }
  // The template passes a string result through tojson, so it arrives quoted.
  if (m.role == "tool" || m.role == "ipython") return llama3_header("ipython") + python_json(m.content) + "<|eot_id|>";
  return llama3_header(m.role) + python_strip(m.content) + "<|eot_id|>";
}

std::string render_llama31(const std::vector<ChatMessage>& messages, const std::vector<ToolDefinition>& tools,
                           bool add_generation_prompt, const std::string& bos) {
  TESSERA_CHECK(!messages.empty(), "messages is empty; the llama3 template needs at least one message");
  size_t next = 0;
  std::string system;
  if (messages[0].role == "system") system = python_strip(messages[next++].content);
  std::string out = bos + llama3_header("system");
  if (!tools.empty()) out += "Environment: ipython\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + system + "<|eot_id|>";
  if (!tools.empty()) {
    // Llama 3.1 was trained with the tools in the first user message, whatever its role.
    TESSERA_CHECK(next < messages.size(),
                  "the llama3 template puts tools in the first user message, and there is no message after the system one");
    out += llama3_header("user") + kLlama31ToolsPreamble;
    for (const auto& tool : tools) out += python_json(tool_json(tool), 4) + "\n\n";
    out += python_strip(messages[next++].content) + "<|eot_id|>";
  }
  for (size_t i = next; i < messages.size(); ++i) out += llama31_message(messages, i);
  if (add_generation_prompt) out += llama3_header("assistant");
  return out;
}

std::string unescape_newlines(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

// The text of a literal system turn the template emits when messages[0] is not a system message,
// e.g. SmolLM2's "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n...".
std::string default_system_prompt_of(const std::string& src) {
  // "!= 'system'" (SmolLM2) or an else branch of "== 'system'" (Qwen2.5).
  const bool conditional = src.find("= 'system'") != std::string::npos || src.find("= \"system\"") != std::string::npos;
  if (!conditional) return {};
  for (const std::string head : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t at = src.find(head); at != std::string::npos; at = src.find(head, at + 1)) {
      const size_t begin = at + head.size();
      const size_t end = src.find("<|im_end|>", begin);
      if (end == std::string::npos) break;
      std::string prompt = src.substr(begin, end - begin);
      // A prompt built from variables ("' + system_message + '") is not a literal default.
      if (prompt.find('\'') != std::string::npos || prompt.find('"') != std::string::npos ||
          prompt.find("{{") != std::string::npos) {
        continue;
      }
      return head.ends_with("\\n") ? unescape_newlines(prompt) : prompt;
    }
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
  const auto has = [&src](const char* text) { return src.find(text) != std::string::npos; };
  if (has("<|im_start|>")) {
    const auto variant = has("<tool_call>") ? ChatTemplateVariant::kQwen25 : ChatTemplateVariant::kBase;
    return ChatTemplate{ChatTemplateKind::kChatML, default_system_prompt_of(src), variant};
  }
  if (has("<|start_header_id|>")) {
    const auto variant = has("Cutting Knowledge Date") ? ChatTemplateVariant::kLlama31 : ChatTemplateVariant::kBase;
    return ChatTemplate{ChatTemplateKind::kLlama3, {}, variant};
  }
  if (has("<<SYS>>")) return ChatTemplate{ChatTemplateKind::kLlama2, {}, ChatTemplateVariant::kBase};
  if (has("[INST]")) {
    const bool tools = has("[AVAILABLE_TOOLS]") || has("[TOOL_CALLS]");
    return ChatTemplate{ChatTemplateKind::kMistral, {}, tools ? ChatTemplateVariant::kMistralV3 : ChatTemplateVariant::kBase};
  }
  return std::nullopt;
}

std::string mistral_tool_call_id(const std::string& id) {
  const auto alphanumeric = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  };
  if (id.size() == 9 && std::all_of(id.begin(), id.end(), alphanumeric)) return id;
  uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (const char c : id) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out(9, '0');
  for (char& c : out) {
    c = kDigits[hash % 62];
    hash /= 62;
  }
  return out;
}

std::optional<ChatTemplateKind> detect_chat_template(const std::string& jinja_source) {
  const auto details = detect_chat_template_details(jinja_source);
  return details ? std::optional<ChatTemplateKind>(details->kind) : std::nullopt;
}

std::string apply_chat_template(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                                const std::vector<ToolDefinition>& tools, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token) {
  const bool tool_use = !tools.empty() || has_tool_turns(messages);
  switch (t.kind) {
    case ChatTemplateKind::kChatML: return render_chatml(t, messages, tools, add_generation_prompt);
    case ChatTemplateKind::kLlama2:
      TESSERA_CHECK(!tool_use, "the llama2 chat template has no tool format: it cannot render tools or tool calls");
      return render_llama2(messages, bos_token, eos_token);
    case ChatTemplateKind::kMistral:
      if (t.variant == ChatTemplateVariant::kMistralV3 || tool_use) {
        return render_mistral_v3(messages, tools, bos_token, eos_token);
      }
      return render_mistral(messages, bos_token, eos_token);
    case ChatTemplateKind::kLlama3:
      if (t.variant == ChatTemplateVariant::kLlama31 || tool_use) {
        return render_llama31(messages, tools, add_generation_prompt, bos_token);
      }
      return render_llama3(messages, add_generation_prompt, bos_token);
  }
  TESSERA_FAIL("unknown chat template kind " << static_cast<int>(t.kind));
}

std::string apply_chat_template(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_token, const std::string& eos_token) {
  return apply_chat_template(t, messages, {}, add_generation_prompt, bos_token, eos_token);
}

std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_token, const std::string& eos_token) {
  return apply_chat_template(ChatTemplate{kind, {}, ChatTemplateVariant::kBase}, messages, add_generation_prompt, bos_token, eos_token);
}

void add_end_of_turn_ids(const Tokenizer& tokenizer, std::vector<int32_t>& ids) {
  for (const char* end_of_turn : {"<|im_end|>", "<|eot_id|>"}) {
    const int32_t id = tokenizer.token_to_id(end_of_turn);
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
}

}  // namespace tessera
