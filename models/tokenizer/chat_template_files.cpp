// models/tokenizer/chat_template_files.cpp: finds the chat template (and BOS/EOS text) a model ships.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/model_files.h"
#include "models/tokenizer/chat_template.h"
#include "models/weights/gguf.h"

namespace tessera {
namespace {

// tokenizer_config.json writes special tokens as "<s>" or {"content": "<s>", ...}.
std::string token_text(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return {};
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

std::string template_text(const nlohmann::json& config, const std::string& path) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return {};
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  TESSERA_CHECK(t.is_array(), path << ": chat_template is neither a string nor a list of named templates");
  for (const auto& named : t) {
    if (named.value("name", "") == "default" && named.contains("template")) return named["template"].get<std::string>();
  }
  return {};
}

std::string gguf_token(const GgufFile& gguf, const char* id_key) {
  const auto id = gguf.find_int(id_key);
  if (!id || *id < 0) return {};
  const auto tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  TESSERA_CHECK(static_cast<size_t>(*id) < tokens.size(),
                gguf.path() << ": " << id_key << " " << *id << " is outside the vocabulary of " << tokens.size());
  return tokens[static_cast<size_t>(*id)];
}

}  // namespace

ModelChatTemplate load_chat_template(const ModelFiles& files) {
  ModelChatTemplate result;
  if (files.format == ModelFormat::kGguf) {
    const auto read = [&](const GgufFile& gguf) {
      result.source = gguf.find_string("tokenizer.chat_template").value_or("");
      result.bos_token = gguf_token(gguf, "tokenizer.ggml.bos_token_id");
      result.eos_token = gguf_token(gguf, "tokenizer.ggml.eos_token_id");
    };
    if (files.gguf) {
      read(*files.gguf);
    } else {
      read(GgufFile::open(files.gguf_path));
    }
  } else {
    const std::filesystem::path path = std::filesystem::path(files.dir) / "tokenizer_config.json";
    std::ifstream in(path);
    if (in) {
      nlohmann::json config;
      try {
        config = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        TESSERA_FAIL(path.string() << ": invalid JSON: " << e.what());
      }
      result.source = template_text(config, path.string());
      result.bos_token = token_text(config, "bos_token");
      result.eos_token = token_text(config, "eos_token");
    }
  }
  if (!result.source.empty()) result.detected = detect_chat_template_details(result.source);
  return result;
}

}  // namespace tessera
