// server/cli/tokenize_command.cpp: `tessera tokenize`: prints the ids and tokens of text, one JSON
// line per input, loading only the tokenizer (never the weights).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/model_files.h"
#include "models/tokenizer/tokenizer.h"
#include "server/cli/commands.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string lines_file;
  bool add_special = false;
  bool with_text = false;
};

// A folder holding only tokenizer files (no config.json, no .gguf) is accepted too, so a tokenizer
// can be inspected without a whole model.
ModelFiles locate_tokenizer(const std::string& model) {
  std::error_code ec;
  const fs::path dir(model);
  if (fs::is_directory(dir, ec) && !fs::exists(dir / "config.json", ec)) {
    bool has_gguf = false;
    for (const auto& entry : fs::directory_iterator(dir, ec)) has_gguf = has_gguf || entry.path().extension() == ".gguf";
    const bool has_tokenizer = fs::exists(dir / "tokenizer.json", ec) || fs::exists(dir / "tokenizer.model", ec) ||
                               fs::exists(dir / "vocab.txt", ec);
    if (!has_gguf && has_tokenizer) {
      ModelFiles files;
      files.name = model;
      files.dir = dir.string();
      return files;
    }
  }
  return locate_model(model);
}

void print_encoding(const Tokenizer& tokenizer, const std::string& text, const TokenizeOptions& o) {
  const Encoding e = tokenizer.encode(text, o.add_special);
  nlohmann::json line = {{"ids", e.ids}, {"tokens", e.tokens}};
  if (o.with_text) line["text"] = tokenizer.decode(e.ids, false);
  const std::string out = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void run_tokenize(const TokenizeOptions& o, bool have_text) {
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(locate_tokenizer(o.model));
  if (have_text) {
    print_encoding(*tokenizer, o.text, o);
    return;
  }
  std::ifstream file;
  if (o.lines_file != "-") {
    file.open(o.lines_file, std::ios::binary);
    TESSERA_CHECK(file.good(), "--lines: cannot open " << o.lines_file);
  }
  std::istream& in = o.lines_file == "-" ? std::cin : file;
  std::string raw;
  for (size_t line_no = 1; std::getline(in, raw); ++line_no) {
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(raw);
    } catch (const nlohmann::json::exception& e) {
      TESSERA_FAIL("--lines " << o.lines_file << ":" << line_no << ": not a JSON string: " << e.what());
    }
    TESSERA_CHECK(value.is_string(), "--lines " << o.lines_file << ":" << line_no << ": expected a JSON string, got "
                                                << value.type_name());
    print_encoding(*tokenizer, value.get<std::string>(), o);
  }
  std::fflush(stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Print the token ids and tokens of text as JSON lines: {\"ids\":[...],\"tokens\":[...]}");
  cmd->add_option("--model", options->model, "Model name (in the model directory), folder or .gguf file")->required();
  auto* text = cmd->add_option("--text", options->text, "Text to tokenize");
  auto* lines = cmd->add_option("--lines", options->lines_file,
                                "File with one JSON string per line (so texts may hold newlines); '-' reads stdin; "
                                "prints one JSON line per input line");
  text->excludes(lines);
  lines->excludes(text);
  cmd->add_flag("--add-special", options->add_special,
                "Add the model's special tokens (BOS, or [CLS] ... [SEP]) as HF's add_special_tokens does");
  cmd->add_flag("--with-text", options->with_text, "Also print \"text\": the decode of the ids (special tokens kept)");
  cmd->callback([options, text, lines] {
    TESSERA_CHECK(text->count() > 0 || lines->count() > 0, "tokenize: give --text or --lines");
    run_tokenize(*options, text->count() > 0);
  });
}

}  // namespace tessera::cli
