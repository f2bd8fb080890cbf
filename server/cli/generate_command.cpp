// server/cli/generate_command.cpp: `tessera generate`: one request through the CPU engine: tokenize
// (or apply the chat template), prefill, decode through the paged KV cache, stream the text to
// stdout, then one JSON line of usage and timings.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/generation.h"
#include "engine/sampler/stop_checker.h"
#include "models/config/model_mask_policy.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tokenizer/chat_template.h"
#include "models/tokenizer/tokenizer.h"
#include "models/weights/gguf.h"
#include "server/cli/backend_choice.h"
#include "server/cli/commands.h"
#include "server/frontend/mask_policy_json.h"

namespace tessera::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  std::string chat;
  std::string system;
  std::string chat_template;  // name override
  int32_t max_tokens = 128;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string attention;
  BackendChoice backend;
  int32_t prefill_chunk = 0;
};

// The model's Jinja chat template source: GGUF metadata or tokenizer_config.json.
std::optional<std::string> chat_template_source(const ModelFiles& files) {
  if (files.gguf) return files.gguf->find_string("tokenizer.chat_template");
  const std::filesystem::path path = std::filesystem::path(files.dir) / "tokenizer_config.json";
  std::ifstream in(path);
  if (!in.good()) return std::nullopt;
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return std::nullopt;
  auto it = config.find("chat_template");
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
    for (const auto& entry : *it) {
      if (entry.value("name", "") == "default" && entry.contains("template")) return entry["template"].get<std::string>();
    }
  }
  return std::nullopt;
}

std::string token_text(const Tokenizer& tokenizer, int64_t id) {
  return id >= 0 && id < tokenizer.vocab_size() ? tokenizer.id_to_token(static_cast<int32_t>(id)) : std::string();
}

void write_stdout(const std::string& text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

void run_generate(const GenerateOptions& o) {
  TESSERA_CHECK(o.prompt.empty() != o.chat.empty(), "generate: give exactly one of --prompt and --chat");
  SamplingParams params;
  params.max_tokens = o.max_tokens;
  params.temperature = o.temperature;
  params.top_p = o.top_p;
  params.top_k = o.top_k;
  params.min_p = o.min_p;
  params.repetition_penalty = o.repetition_penalty;
  params.seed = o.seed;
  params.stop = o.stop;
  params.ignore_eos = o.ignore_eos;
  std::optional<MaskPolicy> attention;
  if (!o.attention.empty()) attention = parse_mask_policy(o.attention);

  const ModelFiles files = locate_model(o.model);
  const ModelConfig config = load_model_config(files);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(files);

  // Prompt text and its tokens.
  std::vector<int32_t> prompt;
  if (!o.chat.empty()) {
    ChatTemplate tmpl;
    if (!o.chat_template.empty()) {
      tmpl.kind = chat_template_from_name(o.chat_template);
    } else {
      const std::optional<std::string> source = chat_template_source(files);
      TESSERA_CHECK(source.has_value(), "generate --chat: " << o.model
                                                            << " has no chat template; pass --chat-template NAME");
      const std::optional<ChatTemplate> detected = detect_chat_template_details(*source);
      TESSERA_CHECK(detected.has_value(), "generate --chat: the chat template of " << o.model
                                              << " is not one Tessera knows; pass --chat-template NAME");
      tmpl = *detected;
    }
    std::vector<ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", o.chat});
    const std::string text = apply_chat_template(tmpl, messages, /*add_generation_prompt=*/true,
                                                 token_text(*tokenizer, config.bos_token_id),
                                                 config.eos_token_ids.empty() ? "" : token_text(*tokenizer, config.eos_token_ids[0]));
    // The template writes BOS itself where the model wants one.
    prompt = tokenizer->encode(text, /*add_special=*/false).ids;
    // The template's end-of-turn token ends generation even when the model's EOS is another token.
    add_end_of_turn_ids(*tokenizer, params.stop_token_ids);
  } else {
    prompt = tokenizer->encode(o.prompt, /*add_special=*/true).ids;
  }
  TESSERA_CHECK(!prompt.empty(), "generate: the prompt encodes to no tokens");
  params.validate();
  // Checked before the weights load, so a bad --attention fails fast.
  const MaskPolicy policy = resolve_mask_policy(attention, config, static_cast<int64_t>(prompt.size()));

  const std::vector<std::unique_ptr<Backend>> backends = make_backends(o.backend);
  Backend& backend = *backends.front();
  ShardedModel model;
  {
    // Copied into the backends, then released.
    const WeightStore weights = load_weights_for(files, o.backend, backend);
    const GraphOptions graph = default_graph_options(config, backend);
    model = ShardedModel::load(backends, [&](Backend& rank) { return make_causal_lm(config, weights, rank, graph); });
  }
  GeneratorConfig gen_config;
  const int64_t needed = static_cast<int64_t>(prompt.size()) + params.max_tokens;
  const int64_t context = config.max_position_embeddings > 0 ? std::min(needed, config.max_position_embeddings) : needed;
  gen_config.num_blocks = static_cast<int32_t>((context + gen_config.block_size - 1) / gen_config.block_size) + 1;
  gen_config.prefill_chunk = o.prefill_chunk;
  Generator generator(model.first(), backend, gen_config, model.followers);

  std::vector<int32_t> eos;
  for (int64_t id : config.eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  StopChecker stop(params, eos);
  IncrementalDecoder decoder(*tokenizer, /*skip_special=*/true);
  GenerationRequest request{prompt, params, attention};
  const GenerationResult result = generator.generate(request, [&](int32_t token) {
    const StopStep step = stop.append(token, decoder.push(token));
    write_stdout(step.text);
    return step.finish == FinishReason::kNone;
  });
  write_stdout(stop.finish(stop.finish_reason() == FinishReason::kStop ? std::string() : decoder.finish()).text);
  FinishReason finish = stop.finish_reason();
  if (finish == FinishReason::kNone && (result.hit_max_tokens || result.hit_context_limit)) finish = FinishReason::kLength;

  const int64_t completion = static_cast<int64_t>(result.tokens.size());
  const double tokens_per_s = result.total_ms > 0 ? completion / (result.total_ms / 1000.0) : 0.0;
  nlohmann::json line = {
      {"usage", {{"prompt_tokens", result.prompt_tokens}, {"completion_tokens", completion},
                 {"total_tokens", result.prompt_tokens + completion}}},
      {"timings", {{"ttft_ms", std::round(result.ttft_ms * 100) / 100},
                   {"total_ms", std::round(result.total_ms * 100) / 100},
                   {"tokens_per_s", std::round(tokens_per_s * 100) / 100},
                   {"decode_tokens_per_s", std::round(result.decode_tokens_per_s * 100) / 100},
                   {"prefill_tokens_per_s",
                    result.ttft_ms > 0 ? std::round(result.prompt_tokens / (result.ttft_ms / 1000.0) * 100) / 100 : 0.0}}},
      {"finish_reason", finish_reason_name(finish)},
      {"attention", mask_policy_to_json(policy)},
      {"backend", backend.name()},
  };
  write_stdout("\n" + line.dump() + "\n");
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt or one chat message");
  cmd->add_option("--model", options->model, "Model name in the model dir, a folder, or a .gguf file")->required();
  auto* prompt = cmd->add_option("--prompt", options->prompt, "Raw prompt text (BOS added as the tokenizer does)");
  auto* chat = cmd->add_option("--chat", options->chat, "One user message, rendered with the model's chat template");
  prompt->excludes(chat);
  cmd->add_option("--system", options->system, "System message for --chat");
  cmd->add_option("--chat-template", options->chat_template, "Override the template: chatml, llama2, mistral, llama3");
  cmd->add_option("--max-tokens", options->max_tokens, "Most tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", options->temperature, "0 is greedy")->capture_default_str();
  cmd->add_option("--top-p", options->top_p, "Nucleus sampling mass, (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", options->top_k, "Keep the k most likely tokens; 0 disables")->capture_default_str();
  cmd->add_option("--min-p", options->min_p, "Drop tokens below min_p x the top probability")->capture_default_str();
  cmd->add_option("--repetition-penalty", options->repetition_penalty, "1 disables")->capture_default_str();
  cmd->add_option_function<uint64_t>("--seed", [options](const uint64_t& s) { options->seed = s; }, "RNG seed");
  cmd->add_option("--stop", options->stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", options->ignore_eos, "Keep generating after EOS");
  cmd->add_option("--attention", options->attention,
                  R"(Mask policy as JSON, e.g. {"sliding_window":{"window":256,"sinks":4}})");
  add_backend_options(*cmd, options->backend);
  cmd->add_option("--prefill-chunk", options->prefill_chunk, "Prefill in chunks of N tokens (0: whole prompt)")
      ->capture_default_str();
  cmd->callback([options] { run_generate(*options); });
}

}  // namespace tessera::cli
