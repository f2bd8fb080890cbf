// server/http/openai_request.cpp: strict, field-naming parsing of OpenAI request bodies.
#include "server/http/openai_request.h"

#include <cmath>
#include <limits>
#include <set>
#include <utility>

namespace tessera::http {
namespace {

using nlohmann::json;

[[noreturn]] void invalid(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::kInvalidRequest, message, param);
}

std::string type_of(const json& j) {
  if (j.is_number_integer() || j.is_number_unsigned()) return "integer";
  if (j.is_number_float()) return "number";
  return j.type_name();
}

// Reads one JSON object's fields by name with type checks; finish() rejects fields never asked for.
// A nested object's fields are named with their path ("response_format.json_schema.name").
class Fields {
 public:
  explicit Fields(const json& object, std::string path = "") : object_(object), path_(std::move(path)) {}

  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  // The value, or null when absent / JSON null (OpenAI treats null as "not given").
  const json* find(const std::string& key) {
    known_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<double> number(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    if (!j->is_number()) invalid(name(key), name(key) + ": expected a number, got " + type_of(*j));
    return j->get<double>();
  }

  std::optional<int64_t> integer(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    return as_integer(*j, name(key));
  }

  static int64_t as_integer(const json& j, const std::string& key) {
    if (j.is_number_unsigned()) {
      if (j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        invalid(key, key + ": " + j.dump() + " is too large");
      }
      return static_cast<int64_t>(j.get<uint64_t>());
    }
    if (j.is_number_integer()) return j.get<int64_t>();
    if (j.is_number_float()) {
      const double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
    }
    invalid(key, key + ": expected an integer, got " + type_of(j) + (j.is_number() ? " " + j.dump() : ""));
  }

  std::optional<bool> boolean(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    if (!j->is_boolean()) invalid(name(key), name(key) + ": expected a boolean, got " + type_of(*j));
    return j->get<bool>();
  }

  std::optional<std::string> string(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    if (!j->is_string()) invalid(name(key), name(key) + ": expected a string, got " + type_of(*j));
    return j->get<std::string>();
  }

  // Accepted and ignored: they do not change what Tessera returns.
  void accept(std::initializer_list<const char*> keys) {
    for (const char* k : keys) known_.insert(k);
  }

  // Fields Tessera cannot honour: an error when given with anything but their default.
  template <typename IsDefault>
  void reject_unless(const std::string& key, IsDefault&& is_default, const std::string& why) {
    const json* j = find(key);
    if (j && !is_default(*j)) invalid(name(key), name(key) + ": " + why);
  }

  void finish() const {
    std::string unknown;
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!known_.count(it.key())) unknown += (unknown.empty() ? "" : ", ") + it.key();
    }
    if (unknown.empty()) return;
    const std::string first = name(unknown.substr(0, unknown.find(',')));
    if (path_.empty()) invalid(first, "Unrecognized request argument supplied: " + unknown);
    invalid(first, path_ + ": unknown field(s): " + unknown);
  }

 private:
  const json& object_;
  std::string path_;
  std::set<std::string> known_;
};

float to_float(double value) { return static_cast<float>(value); }

// Choices one request may ask for: prompts times n.
constexpr int64_t kMaxChoices = 128;

std::string required_model(Fields& f) {
  std::optional<std::string> model = f.string("model");
  if (!model || model->empty()) invalid("model", "model: required");
  return *model;
}

std::vector<int32_t> token_list(const json& j, const std::string& key) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string name = key + "[" + std::to_string(i) + "]";
    if (!j[i].is_number_integer() && !j[i].is_number_unsigned()) {
      invalid(key, name + ": expected a token id (integer), got " + type_of(j[i]));
    }
    const int64_t id = Fields::as_integer(j[i], name);
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) invalid(key, name + ": token id " + j[i].dump() + " is out of range");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

bool is_token_list(const json& j) {
  return j.is_array() && !j.empty() && (j[0].is_number_integer() || j[0].is_number_unsigned());
}

void read_stop(Fields& f, SamplingParams& s) {
  const json* stop = f.find("stop");
  if (!stop) return;
  if (stop->is_string()) {
    if (!stop->get<std::string>().empty()) s.stop.push_back(stop->get<std::string>());
    return;
  }
  if (!stop->is_array()) invalid("stop", "stop: expected a string or a list of strings, got " + type_of(*stop));
  for (size_t i = 0; i < stop->size(); ++i) {
    if (!(*stop)[i].is_string()) {
      invalid("stop", "stop[" + std::to_string(i) + "]: expected a string, got " + type_of((*stop)[i]));
    }
    s.stop.push_back((*stop)[i].get<std::string>());
  }
}

// Schemas as the client wrote them. nlohmann::json sorts object keys, but a schema's property order
// is the order a constrained output writes them in and the order the prompt shows them in, so the
// raw body is parsed once more, keeping order, when it carries a schema.
class ClientOrder {
 public:
  explicit ClientOrder(std::string_view raw_body) : raw_body_(raw_body) {}

  // The value at `pointer` (e.g. "/tools/0/function/parameters") as text in the client's key order;
  // `value` (sorted) when the raw body is not at hand.
  std::string dump(const json& value, const std::string& pointer) {
    if (raw_body_.empty()) return value.dump();
    if (!ordered_) ordered_ = nlohmann::ordered_json::parse(raw_body_, nullptr, /*allow_exceptions=*/false);
    const nlohmann::ordered_json::json_pointer at(pointer);
    if (ordered_->is_discarded() || !ordered_->contains(at)) return value.dump();
    return ordered_->at(at).dump();
  }

 private:
  std::string_view raw_body_;
  std::optional<nlohmann::ordered_json> ordered_;
};

OutputConstraint constraint_of(OutputConstraint::Kind kind, std::string text = "") {
  OutputConstraint c;
  c.kind = kind;
  c.text = std::move(text);
  return c;
}

// response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}.
OutputConstraint read_json_schema_format(const json* format, ClientOrder& order) {
  const std::string path = "response_format.json_schema";
  if (!format) invalid(path, path + ": required with type json_schema");
  if (!format->is_object()) invalid(path, path + ": expected an object, got " + type_of(*format));
  Fields f(*format, path);
  std::optional<std::string> name = f.string("name");
  if (!name || name->empty()) invalid(f.name("name"), f.name("name") + ": required");
  f.string("description");
  f.boolean("strict");  // the schema is always enforced
  const json* schema = f.find("schema");
  if (!schema) invalid(f.name("schema"), f.name("schema") + ": required");
  if (!schema->is_object()) invalid(f.name("schema"), f.name("schema") + ": expected a JSON schema object, got " + type_of(*schema));
  f.finish();
  return constraint_of(OutputConstraint::Kind::kJsonSchema, order.dump(*schema, "/response_format/json_schema/schema"));
}

// nullopt for {"type": "text"}.
std::optional<OutputConstraint> read_response_format(const json& format, ClientOrder& order) {
  if (!format.is_object()) {
    invalid("response_format", "response_format: expected an object such as {\"type\": \"json_object\"}, got " + type_of(format));
  }
  Fields f(format, "response_format");
  std::optional<std::string> type = f.string("type");
  if (!type) invalid(f.name("type"), f.name("type") + ": required (text, json_object or json_schema)");
  std::optional<OutputConstraint> out;
  if (*type == "json_object") {
    out = constraint_of(OutputConstraint::Kind::kJsonObject);
  } else if (*type == "json_schema") {
    out = read_json_schema_format(f.find("json_schema"), order);
  } else if (*type != "text") {
    invalid(f.name("type"), f.name("type") + ": expected text, json_object or json_schema, got \"" + *type + "\"");
  }
  f.finish();
  return out;
}

// structured_outputs.json: a schema, or a schema as JSON text.
OutputConstraint read_structured_json(const json& schema, ClientOrder& order) {
  const std::string field = "structured_outputs.json";
  if (schema.is_object()) return constraint_of(OutputConstraint::Kind::kJsonSchema, order.dump(schema, "/structured_outputs/json"));
  if (!schema.is_string()) invalid(field, field + ": expected a JSON schema (an object or its text), got " + type_of(schema));
  const auto parsed = nlohmann::ordered_json::parse(schema.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) invalid(field, field + ": the text is not a JSON schema object");
  return constraint_of(OutputConstraint::Kind::kJsonSchema, parsed.dump());
}

std::string required_text(const json& value, const std::string& field) {
  if (!value.is_string()) invalid(field, field + ": expected a string, got " + type_of(value));
  if (value.get<std::string>().empty()) invalid(field, field + ": must not be empty");
  return value.get<std::string>();
}

OutputConstraint read_choice(const json& choices) {
  const std::string field = "structured_outputs.choice";
  if (!choices.is_array() || choices.empty()) invalid(field, field + ": expected a non-empty list of strings");
  OutputConstraint c = constraint_of(OutputConstraint::Kind::kChoice);
  for (size_t i = 0; i < choices.size(); ++i) {
    if (!choices[i].is_string()) {
      invalid(field, field + "[" + std::to_string(i) + "]: expected a string, got " + type_of(choices[i]));
    }
    c.choices.push_back(choices[i].get<std::string>());
  }
  return c;
}

// vLLM's structured_outputs: exactly one of json, regex, choice, grammar (EBNF), json_object.
OutputConstraint read_structured_outputs(const json& outputs, ClientOrder& order) {
  const std::string path = "structured_outputs";
  if (!outputs.is_object()) invalid(path, path + ": expected an object such as {\"regex\": \"[0-9]+\"}, got " + type_of(outputs));
  Fields f(outputs, path);
  std::vector<OutputConstraint> given;
  std::string names;
  auto add = [&](const char* key, OutputConstraint c) {
    given.push_back(std::move(c));
    names += (names.empty() ? "" : ", ") + std::string(key);
  };
  if (const json* j = f.find("json")) add("json", read_structured_json(*j, order));
  if (const json* j = f.find("regex")) add("regex", constraint_of(OutputConstraint::Kind::kRegex, required_text(*j, f.name("regex"))));
  if (const json* j = f.find("choice")) add("choice", read_choice(*j));
  if (const json* j = f.find("grammar")) add("grammar", constraint_of(OutputConstraint::Kind::kEbnf, required_text(*j, f.name("grammar"))));
  if (f.boolean("json_object").value_or(false)) add("json_object", constraint_of(OutputConstraint::Kind::kJsonObject));
  const bool compact = f.boolean("disable_any_whitespace").value_or(false);
  f.accept({"disable_fallback"});
  f.finish();
  if (given.size() != 1) {
    invalid(path, path + ": give exactly one of json, regex, choice, grammar, json_object" +
                      (given.empty() ? std::string() : "; got " + names));
  }
  given[0].any_whitespace = !compact;
  return given[0];
}

// response_format and structured_outputs: at most one constrains the output.
void read_constraint(Fields& f, GenerateInput& input, ClientOrder& order) {
  std::optional<OutputConstraint> format;
  if (const json* j = f.find("response_format")) format = read_response_format(*j, order);
  const json* outputs = f.find("structured_outputs");
  if (outputs && format) {
    invalid("structured_outputs", std::string("structured_outputs: cannot be combined with response_format ") +
                                      constraint_kind_name(format->kind));
  }
  if (outputs) {
    input.constraint = read_structured_outputs(*outputs, order);
    input.constraint_param = "structured_outputs";
  } else {
    input.constraint = std::move(format);
    input.constraint_param = "response_format";
  }
}

ToolDefinition read_tool(const json& tool, const std::string& name, size_t index, ClientOrder& order) {
  if (!tool.is_object()) invalid(name, name + ": expected an object, got " + type_of(tool));
  Fields f(tool, name);
  std::optional<std::string> type = f.string("type");
  if (type != "function") {
    invalid(f.name("type"), f.name("type") + ": only \"function\" tools are supported" + (type ? ", got \"" + *type + "\"" : ""));
  }
  const json* function = f.find("function");
  if (!function || !function->is_object()) invalid(f.name("function"), f.name("function") + ": required, an object");
  Fields ff(*function, f.name("function"));
  ToolDefinition out;
  std::optional<std::string> function_name = ff.string("name");
  if (!function_name) invalid(ff.name("name"), ff.name("name") + ": required");
  out.name = *function_name;
  out.description = ff.string("description").value_or("");
  if (const json* parameters = ff.find("parameters")) {
    if (!parameters->is_object()) {
      invalid(ff.name("parameters"), ff.name("parameters") + ": expected a JSON schema object, got " + type_of(*parameters));
    }
    out.parameters = order.dump(*parameters, "/tools/" + std::to_string(index) + "/function/parameters");
  }
  ff.boolean("strict");  // arguments are always held to the parameters schema
  ff.finish();
  f.finish();
  return out;
}

std::vector<ToolDefinition> read_tools(const json& tools, ClientOrder& order) {
  if (!tools.is_array()) invalid("tools", "tools: expected a list of tools, got " + type_of(tools));
  if (tools.size() > kMaxTools) {
    invalid("tools", "tools: at most " + std::to_string(kMaxTools) + " tools, got " + std::to_string(tools.size()));
  }
  std::vector<ToolDefinition> out;
  for (size_t i = 0; i < tools.size(); ++i) out.push_back(read_tool(tools[i], "tools[" + std::to_string(i) + "]", i, order));
  return out;
}

// "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.
ToolChoice read_tool_choice(const json& choice) {
  ToolChoice out;
  if (choice.is_string()) {
    const std::string mode = choice.get<std::string>();
    if (mode == "none") out.mode = ToolChoice::Mode::kNone;
    else if (mode == "auto") out.mode = ToolChoice::Mode::kAuto;
    else if (mode == "required") out.mode = ToolChoice::Mode::kRequired;
    else invalid("tool_choice", "tool_choice: expected none, auto, required or a function, got \"" + mode + "\"");
    return out;
  }
  if (!choice.is_object()) invalid("tool_choice", "tool_choice: expected a string or an object, got " + type_of(choice));
  Fields f(choice, "tool_choice");
  if (f.string("type") != "function") invalid(f.name("type"), f.name("type") + ": must be \"function\"");
  const json* function = f.find("function");
  if (!function || !function->is_object()) invalid(f.name("function"), f.name("function") + ": required, an object");
  Fields ff(*function, f.name("function"));
  std::optional<std::string> name = ff.string("name");
  if (!name) invalid(ff.name("name"), ff.name("name") + ": required");
  ff.finish();
  f.finish();
  out.mode = ToolChoice::Mode::kFunction;
  out.function = *name;
  return out;
}

// tools, tool_choice and parallel_tool_calls. tool_choice defaults to auto with tools, none without.
void read_tool_fields(Fields& f, GenerateInput& input, ClientOrder& order) {
  if (const json* tools = f.find("tools")) input.tools = read_tools(*tools, order);
  if (input.tools.empty()) input.tool_choice.mode = ToolChoice::Mode::kNone;
  if (const json* choice = f.find("tool_choice")) input.tool_choice = read_tool_choice(*choice);
  if (auto v = f.boolean("parallel_tool_calls")) input.parallel_tool_calls = *v;
}

// Fields shared by completions and chat: sampling, streaming, vLLM's extras, the tessera object.
void read_common(Fields& f, ParsedGenerate& out, ClientOrder& order) {
  SamplingParams& s = out.input.sampling;
  out.input.model = required_model(f);
  if (auto v = f.number("temperature")) s.temperature = to_float(*v);
  if (auto v = f.number("top_p")) s.top_p = to_float(*v);
  if (auto v = f.integer("top_k")) {
    if (*v < -1 || *v > std::numeric_limits<int32_t>::max()) invalid("top_k", "top_k must be >= -1, got " + std::to_string(*v));
    s.top_k = static_cast<int32_t>(*v);
  }
  if (auto v = f.number("min_p")) s.min_p = to_float(*v);
  if (auto v = f.number("repetition_penalty")) s.repetition_penalty = to_float(*v);
  if (auto v = f.number("presence_penalty")) s.presence_penalty = to_float(*v);
  if (auto v = f.number("frequency_penalty")) s.frequency_penalty = to_float(*v);
  if (auto v = f.integer("seed")) s.seed = static_cast<uint64_t>(*v);
  if (auto v = f.integer("max_tokens")) out.input.max_tokens = *v;
  if (auto v = f.integer("min_tokens")) {
    if (*v < 0 || *v > std::numeric_limits<int32_t>::max()) invalid("min_tokens", "min_tokens must be >= 0, got " + std::to_string(*v));
    s.min_tokens = static_cast<int32_t>(*v);
  }
  read_stop(f, s);
  if (const json* ids = f.find("stop_token_ids")) {
    if (!ids->is_array()) invalid("stop_token_ids", "stop_token_ids: expected a list of token ids, got " + type_of(*ids));
    s.stop_token_ids = token_list(*ids, "stop_token_ids");
  }
  if (auto v = f.boolean("ignore_eos")) s.ignore_eos = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) s.include_stop_str_in_output = *v;
  if (auto v = f.boolean("skip_special_tokens")) s.skip_special_tokens = *v;
  if (auto v = f.boolean("stream")) out.stream = *v;
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) invalid("stream_options", "stream_options: expected an object, got " + type_of(*so));
    Fields sf(*so);
    if (auto v = sf.boolean("include_usage")) out.include_usage = *v;
    sf.accept({"continuous_usage_stats"});
    try {
      sf.finish();
    } catch (const ApiError& e) {
      invalid("stream_options", std::string("stream_options: ") + e.what());
    }
  }
  if (auto n = f.integer("n")) {
    if (*n < 1 || *n > kMaxChoices) {
      invalid("n", "n must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(*n));
    }
    out.n = static_cast<int32_t>(*n);
  }
  f.reject_unless("logit_bias", [](const json& j) { return j.is_object() && j.empty(); }, "logit_bias is not supported");
  if (const json* t = f.find("tessera")) out.input.attention = parse_tessera_extension(*t);
  read_constraint(f, out.input, order);
  // Fields that do not change results.
  f.accept({"user", "metadata", "service_tier", "store", "prompt_cache_key", "safety_identifier"});
}

// A message's content: a string or a list of text parts, concatenated.
std::string read_content(const json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    invalid(name + ".content", name + ".content: expected a string or a list of text parts, got " + type_of(content));
  }
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const std::string part_name = name + ".content[" + std::to_string(k) + "]";
    const json& part = content[k];
    if (!part.is_object()) invalid(part_name, part_name + ": expected an object, got " + type_of(part));
    Fields pf(part);
    std::optional<std::string> type = pf.string("type");
    if (type != "text") {
      invalid(part_name + ".type", part_name + ".type: only \"text\" parts are supported, got " +
                                       (type ? "\"" + *type + "\"" : std::string("none")));
    }
    std::optional<std::string> part_text = pf.string("text");
    if (!part_text) invalid(part_name + ".text", part_name + ".text: required");
    text += *part_text;
    pf.finish();
  }
  return text;
}

// One of an assistant message's tool_calls: {id, type "function", function {name, arguments}}.
// Arguments are a JSON object as text (OpenAI's form) or, leniently, the object itself.
ToolCall read_tool_call(const json& call, const std::string& name) {
  if (!call.is_object()) invalid(name, name + ": expected an object, got " + type_of(call));
  Fields f(call, name);
  ToolCall out;
  out.id = f.string("id").value_or("");
  if (std::optional<std::string> type = f.string("type"); type && *type != "function") {
    invalid(f.name("type"), f.name("type") + ": only \"function\" is supported, got \"" + *type + "\"");
  }
  const json* function = f.find("function");
  if (!function || !function->is_object()) invalid(f.name("function"), f.name("function") + ": required, an object");
  Fields ff(*function, f.name("function"));
  std::optional<std::string> function_name = ff.string("name");
  if (!function_name || function_name->empty()) invalid(ff.name("name"), ff.name("name") + ": required");
  out.name = *function_name;
  const json* arguments = ff.find("arguments");
  if (arguments && arguments->is_object()) {
    out.arguments = arguments->dump();
  } else {
    out.arguments = arguments && arguments->is_string() ? arguments->get<std::string>() : "{}";
    if (arguments && !arguments->is_string()) {
      invalid(ff.name("arguments"), ff.name("arguments") + ": expected a JSON object as a string, got " + type_of(*arguments));
    }
    if (!json::parse(out.arguments, nullptr, /*allow_exceptions=*/false).is_object()) {
      invalid(ff.name("arguments"), ff.name("arguments") + ": not a JSON object: " + out.arguments.substr(0, 80));
    }
  }
  ff.finish();
  f.finish();
  return out;
}

std::vector<ToolCall> read_tool_calls(const json& calls, const std::string& name) {
  if (!calls.is_array()) invalid(name, name + ": expected a list of tool calls, got " + type_of(calls));
  std::vector<ToolCall> out;
  for (size_t k = 0; k < calls.size(); ++k) out.push_back(read_tool_call(calls[k], name + "[" + std::to_string(k) + "]"));
  return out;
}

ChatMessage read_message(const json& m, const std::string& name) {
  if (!m.is_object()) invalid(name, name + ": expected an object, got " + type_of(m));
  Fields f(m);
  ChatMessage msg;
  std::optional<std::string> role = f.string("role");
  if (!role) invalid(name + ".role", name + ".role: required");
  if (*role == "developer") role = "system";  // OpenAI's newer name for system
  if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool") {
    invalid(name + ".role", name + ".role: '" + *role + "' is not supported (system, developer, user, assistant, tool)");
  }
  msg.role = *role;
  const json* content = f.find("content");
  if (content) msg.content = read_content(*content, name);
  if (const json* calls = f.find("tool_calls")) {
    if (msg.role != "assistant") invalid(name + ".tool_calls", name + ".tool_calls: only assistant messages make tool calls");
    msg.tool_calls = read_tool_calls(*calls, name + ".tool_calls");
  }
  if (!content && msg.role != "assistant") invalid(name + ".content", name + ".content: required");
  if (std::optional<std::string> id = f.string("tool_call_id")) {
    if (msg.role != "tool") invalid(name + ".tool_call_id", name + ".tool_call_id: only tool messages answer a call");
    msg.tool_call_id = *id;
  }
  if (msg.role == "tool" && msg.tool_call_id.empty()) invalid(name + ".tool_call_id", name + ".tool_call_id: required for role tool");
  f.accept({"name", "refusal"});
  try {
    f.finish();
  } catch (const ApiError& e) {
    invalid(name, name + ": " + e.what());
  }
  return msg;
}

std::vector<ChatMessage> read_messages(const json* messages) {
  if (!messages) invalid("messages", "messages: required");
  if (!messages->is_array()) invalid("messages", "messages: expected a list of messages, got " + type_of(*messages));
  if (messages->empty()) invalid("messages", "messages: must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages->size(); ++i) out.push_back(read_message((*messages)[i], "messages[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace

size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

nlohmann::json parse_body(std::string_view body) {
  const size_t bad = find_invalid_utf8(body);
  if (bad != std::string_view::npos) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   "The request body is not valid UTF-8 (invalid byte at offset " + std::to_string(bad) + ").");
  }
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   "The request body is not valid JSON (at byte " + std::to_string(e.byte) + ").");
  } catch (const json::out_of_range&) {  // a number such as 1e309 that no double holds
    throw ApiError(ErrorKind::kInvalidRequest, "The request body holds a number out of range.");
  }
  if (!j.is_object()) {
    throw ApiError(ErrorKind::kInvalidRequest, "The request body must be a JSON object, got " + type_of(j) + ".");
  }
  return j;
}

ParsedGenerate parse_completion_request(const json& body, std::string_view raw_body) {
  ParsedGenerate out;
  Fields f(body);
  ClientOrder order(raw_body);
  read_common(f, out, order);
  const json* prompt = f.find("prompt");
  if (!prompt) invalid("prompt", "prompt: required");
  if (prompt->is_string()) {
    out.prompts.push_back({prompt->get<std::string>(), std::nullopt});
  } else if (is_token_list(*prompt)) {
    out.prompts.push_back({std::nullopt, token_list(*prompt, "prompt")});
  } else if (prompt->is_array() && !prompt->empty()) {
    // A batch: strings, or token lists, not mixed (as OpenAI takes them).
    const bool strings = (*prompt)[0].is_string();
    for (size_t i = 0; i < prompt->size(); ++i) {
      const json& item = (*prompt)[i];
      const std::string name = "prompt[" + std::to_string(i) + "]";
      if (strings && item.is_string()) {
        out.prompts.push_back({item.get<std::string>(), std::nullopt});
      } else if (!strings && is_token_list(item)) {
        out.prompts.push_back({std::nullopt, token_list(item, name)});
      } else {
        invalid("prompt", name + ": expected " + std::string(strings ? "a string" : "a non-empty list of token ids") +
                              " like prompt[0], got " + (item.is_array() && item.empty() ? "an empty list" : type_of(item)));
      }
    }
  } else {
    invalid("prompt", "prompt: expected a string, a list of token ids, or a non-empty list of either");
  }
  if (static_cast<int64_t>(out.prompts.size()) * out.n > kMaxChoices) {
    invalid("n", "prompts times n must be at most " + std::to_string(kMaxChoices) + ", got " +
                     std::to_string(out.prompts.size()) + " x " + std::to_string(out.n));
  }
  out.input.prompt_text = out.prompts[0].text;
  out.input.prompt_tokens = out.prompts[0].tokens;
  if (auto v = f.integer("logprobs")) {
    if (*v < 0 || *v > SamplingParams::kMaxLogprobs) {
      invalid("logprobs", "logprobs must be in [0, " + std::to_string(SamplingParams::kMaxLogprobs) + "], got " +
                              std::to_string(*v));
    }
    out.logprobs = static_cast<int32_t>(*v);
    out.input.sampling.logprobs = out.logprobs;
  }
  if (auto v = f.boolean("echo")) out.echo = *v;
  // Echo with logprobs returns the prompt tokens' logprobs too; max_tokens 0 with echo only scores
  // the prompt (lm-evaluation-harness's log-likelihood request).
  if (out.echo && (out.logprobs || out.input.max_tokens == 0)) out.input.sampling.prompt_logprobs = out.logprobs.value_or(0);
  if (out.input.max_tokens == 0 && !out.echo) {
    invalid("max_tokens", "max_tokens: must be at least 1, got 0 (0 is accepted with echo, to score the prompt)");
  }
  if (auto b = f.integer("best_of"); b && *b != 1 && *b != out.n) {
    invalid("best_of", "best_of: only best_of=1 or best_of=n is supported (no server-side ranking), got " + std::to_string(*b));
  }
  f.reject_unless("suffix", [](const json& j) { return j.is_string() && j.get<std::string>().empty(); },
                  "suffix is not supported");
  for (const char* key : {"tools", "tool_choice", "parallel_tool_calls"}) {
    f.reject_unless(key, [](const json&) { return false; }, "only /v1/chat/completions takes tools");
  }
  f.finish();
  return out;
}

ParsedGenerate parse_chat_request(const json& body, std::string_view raw_body) {
  ParsedGenerate out;
  out.chat = true;
  Fields f(body);
  ClientOrder order(raw_body);
  read_common(f, out, order);
  out.input.messages = read_messages(f.find("messages"));
  read_tool_fields(f, out.input, order);
  if (auto v = f.integer("max_completion_tokens")) out.input.max_tokens = *v;
  if (auto v = f.boolean("add_generation_prompt")) out.input.add_generation_prompt = *v;
  if (auto v = f.boolean("logprobs")) out.chat_logprobs = *v;
  if (auto v = f.integer("top_logprobs")) {
    if (*v < 0 || *v > SamplingParams::kMaxLogprobs) {
      invalid("top_logprobs", "top_logprobs must be in [0, " + std::to_string(SamplingParams::kMaxLogprobs) +
                                  "], got " + std::to_string(*v));
    }
    if (!out.chat_logprobs) invalid("top_logprobs", "top_logprobs: needs logprobs=true");
    out.logprobs = static_cast<int32_t>(*v);
  }
  if (out.chat_logprobs) out.input.sampling.logprobs = out.logprobs.value_or(0);
  const auto empty_list = [](const json& j) { return j.is_array() && j.empty(); };
  f.reject_unless("functions", empty_list, "the deprecated functions field is not supported; use tools");
  f.reject_unless("function_call", [](const json& j) { return j == "none" || j == "auto"; },
                  "the deprecated function_call field is not supported; use tool_choice");
  f.reject_unless("modalities", [](const json& j) { return j == json::array({"text"}); },
                  "only [\"text\"] is supported");
  f.reject_unless("audio", [](const json&) { return false; }, "audio output is not supported");
  f.reject_unless("prediction", [](const json&) { return false; }, "predicted outputs are not supported");
  f.reject_unless("reasoning_effort", [](const json&) { return false; }, "reasoning_effort is not supported");
  f.reject_unless("web_search_options", [](const json&) { return false; }, "web search is not supported");
  f.finish();
  return out;
}

ParsedEmbeddings parse_embeddings_request(const json& body) {
  ParsedEmbeddings out;
  Fields f(body);
  out.input.model = required_model(f);
  const json* input = f.find("input");
  if (!input) invalid("input", "input: required");
  if (input->is_string()) {
    out.input.texts.push_back(input->get<std::string>());
  } else if (is_token_list(*input)) {
    out.input.token_inputs.push_back(token_list(*input, "input"));
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const json& item = (*input)[i];
      const std::string name = "input[" + std::to_string(i) + "]";
      if (item.is_string() && out.input.token_inputs.empty()) {
        out.input.texts.push_back(item.get<std::string>());
      } else if (item.is_array() && out.input.texts.empty()) {
        if (item.empty()) invalid("input", name + ": must not be empty");
        out.input.token_inputs.push_back(token_list(item, name));
      } else {
        invalid("input", name + ": expected " +
                             std::string(out.input.token_inputs.empty() ? "a string" : "a list of token ids") +
                             " like the other items, got " + type_of(item));
      }
    }
  } else {
    invalid("input", "input: expected a string, a list of strings, a list of token ids or a list of those");
  }
  if (auto format = f.string("encoding_format")) {
    if (*format == "base64") out.base64 = true;
    else if (*format != "float") invalid("encoding_format", "encoding_format: expected float or base64, got '" + *format + "'");
  }
  // Not an OpenAI field: false refuses inputs over the model's limit instead of truncating them.
  if (auto v = f.boolean("truncate")) out.input.truncate = *v;
  f.reject_unless("dimensions", [](const json&) { return false; }, "dimensions is not supported (the model's size is returned)");
  f.accept({"user"});
  f.finish();
  return out;
}

ParsedTokenize parse_tokenize_request(const json& body) {
  ParsedTokenize out;
  Fields f(body);
  out.model = f.string("model").value_or("");
  out.prompt = f.string("prompt");
  if (const json* m = f.find("messages")) out.messages = read_messages(m);
  if (out.prompt.has_value() == out.messages.has_value()) {
    invalid("prompt", "give exactly one of prompt and messages");
  }
  if (auto v = f.boolean("add_special_tokens")) out.add_special_tokens = *v;
  if (auto v = f.boolean("add_generation_prompt")) out.add_generation_prompt = *v;
  f.finish();
  return out;
}

ParsedDetokenize parse_detokenize_request(const json& body) {
  ParsedDetokenize out;
  Fields f(body);
  out.model = f.string("model").value_or("");
  const json* tokens = f.find("tokens");
  if (!tokens) invalid("tokens", "tokens: required");
  if (!tokens->is_array()) invalid("tokens", "tokens: expected a list of token ids, got " + type_of(*tokens));
  out.tokens = token_list(*tokens, "tokens");
  f.finish();
  return out;
}

}  // namespace tessera::http
