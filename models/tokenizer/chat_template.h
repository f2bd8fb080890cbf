// models/tokenizer/chat_template.h: chat templates (ChatML, Llama-2, Mistral [INST], Llama-3),
// chosen from model metadata or overridden by name, rendering tools and tool calls where the model
// has a tool format (Llama 3.1 JSON calls, Mistral v0.3 [TOOL_CALLS], Hermes/Qwen2.5 <tool_call>).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct ModelFiles;
class Tokenizer;

// A function call an assistant message made (OpenAI's tool_calls[i]).
struct ToolCall {
  std::string id;         // "call_..."; templates that need another form (Mistral's 9 characters) derive it
  // (mistral_tool_call_id)
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role_, std::string content_) : role(std::move(role_)), content(std::move(content_)) {}

  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant messages that called tools
  std::string tool_call_id;          // role "tool": the call this message answers
};

// A function the model may call (OpenAI's tools[i] of type "function").
struct ToolDefinition {
  std::string name;
  std::string description;  // "" when absent
  // The parameters JSON schema as the client wrote it (keys in its order); "" when absent.
  std::string parameters;
};

enum class ChatTemplateKind { kChatML, kLlama2, kMistral, kLlama3 };

// The known sources of one kind differ beyond the kind:
//   kLlama31:   Llama 3.1's template: always a dated system turn, tools in the first user turn.
//   kMistralV3: Mistral v0.3's: "[INST] x[/INST]", the system text in the last user turn, tools.
//   kQwen25:    Qwen2.5's ChatML: tools in the system turn; needs at least one message.
// kBase renders the kind's plain template; given tools or tool messages, a kBase Llama-3 or Mistral
// template renders as kLlama31 / kMistralV3 would, and ChatML as kQwen25 (with its own default
// system prompt), since those are the formats their models call tools in.
enum class ChatTemplateVariant { kBase, kLlama31, kMistralV3, kQwen25 };

// Mistral v0.3 requires call ids of 9 ASCII letters and digits: such an id is kept, any other is
// mapped to one by a hash, so a call and the result that names it still match.
std::string mistral_tool_call_id(const std::string& id);

const char* chat_template_name(ChatTemplateKind kind);
// "chatml", "llama2", "mistral", "llama3"; throws tessera::Error listing the known names otherwise.
ChatTemplateKind chat_template_from_name(const std::string& name);
// Recognises the template from its Jinja source (tokenizer.chat_template in GGUF,
// tokenizer_config.json); nullopt when unrecognised.
std::optional<ChatTemplateKind> detect_chat_template(const std::string& jinja_source);

// Renders messages, ending with the assistant prompt when add_generation_prompt.
// bos is prepended as text where the template does (Llama-2/Mistral/Llama-3).
std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_token = "",
                                const std::string& eos_token = "");

// What a recognised template carries beyond its kind.
struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::kChatML;
  // Rendered as a system message when the first message is not one (SmolLM2's ChatML template
  // does this); empty for none. ChatML only.
  std::string default_system_prompt;
  ChatTemplateVariant variant = ChatTemplateVariant::kBase;
};

// As detect_chat_template, keeping a default system prompt written in the template.
std::optional<ChatTemplate> detect_chat_template_details(const std::string& jinja_source);

// Renders as the real Jinja templates do. Throws tessera::Error naming the message when roles do
// not alternate user/assistant where the template requires it (Llama-2, Mistral), or a role is not
// one the template knows (Mistral's template has no system role, so a system message is an error).
std::string apply_chat_template(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_token = "",
                                const std::string& eos_token = "");

// As above, offering the model tools (none when empty), as transformers' apply_chat_template(tools=)
// renders them: tool definitions and call arguments re-serialised as its tojson writes them (keys in
// the order given, ", " and ": " separators, non-ASCII kept). Throws tessera::Error when the
// template has no tool format (Llama-2), when a call's arguments or a tool's parameters are not
// JSON, and where the template refuses the conversation (Llama 3.1 takes one call per message).
std::string apply_chat_template(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                                const std::vector<ToolDefinition>& tools, bool add_generation_prompt,
                                const std::string& bos_token = "", const std::string& eos_token = "");

// The chat template a model ships: GGUF tokenizer.chat_template, or tokenizer_config.json's
// "chat_template" (a string, or the entry named "default" in a list of named templates), with the
// BOS/EOS strings the template writes.
struct ModelChatTemplate {
  std::string source;                    // the Jinja text; empty when the model ships none
  std::optional<ChatTemplate> detected;  // nullopt when absent or not one of the known templates
  std::string bos_token, eos_token;      // as text ("" when the model names none)
};
// Throws tessera::Error naming the file when tokenizer_config.json or the GGUF metadata is malformed.
ModelChatTemplate load_chat_template(const ModelFiles& files);

// Adds to `ids`, each once, the chat templates' end-of-turn tokens (<|im_end|>, <|eot_id|>) that
// `tokenizer` has: a chat answer ends there even when the model's EOS is another token.
void add_end_of_turn_ids(const Tokenizer& tokenizer, std::vector<int32_t>& ids);

}  // namespace tessera
