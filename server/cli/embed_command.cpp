// server/cli/embed_command.cpp: `tessera embed`: sentence embeddings from an encoder (BERT), all texts
// packed into one varlen batch (no padding); one JSON line {"embedding":[...]} per text. Texts over
// the model's limit are truncated as the server does (--no-truncate refuses them instead).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "models/config/encoder_input.h"
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
  bool no_truncate = false;  // refuse texts over the model's limit instead of truncating them
};

void run_embed(const EmbedOptions& o) {
  TESSERA_CHECK(!o.texts.empty(), "embed: give at least one TEXT");
  const ModelFiles files = locate_model(o.model);
  const ModelConfig config = load_model_config(files);
  TESSERA_CHECK(config.arch == Architecture::kBert,
                "embed: " << o.model << " is a " << architecture_name(config.arch) << " model; embed needs an encoder (bert)");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(files);

  std::vector<std::vector<int32_t>> inputs;
  for (const std::string& text : o.texts) {
    inputs.push_back(tokenizer->encode(text, /*add_special=*/true).ids);
    TESSERA_CHECK(!inputs.back().empty(), "embed: a text encodes to no tokens");
  }
  // The server's rule (models/config/encoder_input.h), so a text embeds the same here and there.
  if (const std::optional<EncoderInputOverLimit> over =
          fit_encoder_inputs(inputs, encoder_input_limit(config), !o.no_truncate, *tokenizer)) {
    TESSERA_FAIL("embed: " << over->message("leave out --no-truncate or shorten it"));
  }
  std::vector<int32_t> ids;
  std::vector<AttentionPlan::Sequence> seqs;
  const MaskPolicy policy = MaskPolicy::bidirectional();
  for (const std::vector<int32_t>& one : inputs) {
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
  cmd->add_flag("--no-truncate", options->no_truncate,
                "Refuse a text over the model's limit (max_seq_length, else max_position_embeddings) instead of "
                "truncating it to the limit as sentence-transformers does");
  cmd->add_option("texts", options->texts, "Texts to embed")->required();
  cmd->callback([options] { run_embed(*options); });
}

}  // namespace tessera::cli
