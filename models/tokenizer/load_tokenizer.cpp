// models/tokenizer/load_tokenizer.cpp: picks the tokenizer a model ships.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/model_files.h"
#include "models/tokenizer/builders.h"
#include "models/weights/gguf.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// tokenizer_config.json, or an empty object when the folder has none.
nlohmann::json tokenizer_config(const fs::path& dir) {
  const fs::path path = dir / "tokenizer_config.json";
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL(path.string() << ": invalid JSON: " << e.what());
  }
}

bool config_flag(const nlohmann::json& config, const char* key, bool fallback) {
  return config.contains(key) && config[key].is_boolean() ? config[key].get<bool>() : fallback;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const ModelFiles& files) {
  if (files.format == ModelFormat::kGguf) {
    if (files.gguf) return tok::tokenizer_from_gguf(tok::read_gguf_tokenizer_data(*files.gguf));
    return tok::tokenizer_from_gguf(tok::read_gguf_tokenizer_data(GgufFile::open(files.gguf_path)));
  }
  const fs::path dir(files.dir);
  std::error_code ec;
  if (fs::is_regular_file(dir / "tokenizer.json", ec)) return tok::load_tokenizer_json((dir / "tokenizer.json").string());
  if (fs::is_regular_file(dir / "tokenizer.model", ec)) {
    const auto config = tokenizer_config(dir);
    return tok::load_sentencepiece_model((dir / "tokenizer.model").string(), config_flag(config, "add_bos_token", true),
                                         config_flag(config, "add_eos_token", false));
  }
  if (fs::is_regular_file(dir / "vocab.txt", ec)) {
    const auto config = tokenizer_config(dir);
    return tok::load_wordpiece_vocab((dir / "vocab.txt").string(), config_flag(config, "do_lower_case", true));
  }
  TESSERA_FAIL("model '" << files.name << "': " << dir.string()
                         << " has no tokenizer (looked for tokenizer.json, tokenizer.model and vocab.txt)");
}

}  // namespace tessera
