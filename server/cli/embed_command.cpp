// server/cli/embed_command.cpp: `tessera embed`: sentence embeddings from an encoder (BERT), all texts
// packed into one varlen batch (no padding); one JSON line {"embedding":[...]} per text.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tokenizer/tokenizer.h"
#include "server/cli/commands.h"

namespace tessera::cli {
namespace {

struct EmbedOptions {
  std::string model;
  std::vector<std::string> texts;
  int threads = 0;
};

// sentence-transformers truncates inputs to max_seq_length (sentence_bert_config.json) when given.
int64_t max_tokens_per_text(const ModelFiles& files, const ModelConfig& config) {
  int64_t limit = config.max_position_embeddings;
  std::ifstream in(std::filesystem::path(files.dir) / "sentence_bert_config.json");
  if (in.good()) {
    const nlohmann::json st = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!st.is_discarded() && st.contains("max_seq_length") && st["max_seq_length"].is_number_integer()) {
      limit = std::min<int64_t>(limit, st["max_seq_length"].get<int64_t>());
    }
  }
  return limit;
}

void run_embed(const EmbedOptions& o) {
  TESSERA_CHECK(!o.texts.empty(), "embed: give at least one TEXT");
  const ModelFiles files = locate_model(o.model);
  const ModelConfig config = load_model_config(files);
  TESSERA_CHECK(config.arch == Architecture::kBert,
                "embed: " << o.model << " is a " << architecture_name(config.arch) << " model; embed needs an encoder (bert)");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(files);
  const int64_t limit = max_tokens_per_text(files, config);

  std::vector<int32_t> ids;
  std::vector<AttentionPlan::Sequence> seqs;
  const MaskPolicy policy = MaskPolicy::bidirectional();
  for (const std::string& text : o.texts) {
    std::vector<int32_t> one = tokenizer->encode(text, /*add_special=*/true).ids;
    TESSERA_CHECK(!one.empty(), "embed: a text encodes to no tokens");
    if (static_cast<int64_t>(one.size()) > limit) {
      // As HF truncation does: cut the text, keep the closing special token ([SEP]).
      const int32_t last = one.back();
      one.resize(limit - 1);
      one.push_back(last);
    }
    ids.insert(ids.end(), one.begin(), one.end());
    seqs.push_back({static_cast<int32_t>(one.size()), static_cast<int32_t>(one.size()), &policy, {}});
  }
  CpuBackend backend(o.threads);
  std::unique_ptr<Encoder> model;
  {
    const WeightStore weights = load_weights(files);
    model = make_encoder(config, weights, backend);
  }
  AttentionPlan plan = AttentionPlan::build(seqs, 0);
  backend.prepare_plan(plan);
  ForwardBatch batch;
  batch.token_ids = ids;
  batch.plan = &plan;
  const Tensor embeddings = model->embed(batch);
  const std::vector<float> values = backend.download(embeddings);
  const size_t dim = static_cast<size_t>(embeddings.dim(1));
  for (size_t i = 0; i < o.texts.size(); ++i) {
    const nlohmann::json line = {{"embedding", std::vector<float>(values.begin() + i * dim, values.begin() + (i + 1) * dim)}};
    const std::string out = line.dump() + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
}

}  // namespace

void add_embed_command(CLI::App& app) {
  auto options = std::make_shared<EmbedOptions>();
  CLI::App* cmd = app.add_subcommand("embed", "Sentence embeddings of texts (encoder models, CPU engine)");
  cmd->add_option("--model", options->model, "Model name in the model dir, or a folder")->required();
  cmd->add_option("--threads", options->threads, "CPU threads (0: OMP_NUM_THREADS or all cores)")->capture_default_str();
  cmd->add_option("texts", options->texts, "Texts to embed")->required();
  cmd->callback([options] { run_embed(*options); });
}

}  // namespace tessera::cli
