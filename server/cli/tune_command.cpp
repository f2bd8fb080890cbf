// server/cli/tune_command.cpp: `tessera tune --model M --space configs/tune/<name>.yaml --out DIR`: the
// offline tuner (tuner/tune.h) on this machine's backend.
#include <cstdint>
#include <memory>
#include <string>

#include "server/cli/commands.h"
#include "tuner/tune.h"

namespace tessera::cli {

void add_tune_command(CLI::App& app) {
  auto options = std::make_shared<tuner::TuneOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tune", "Measure weight formats, fusions and kernel choices on this machine; write DIR/profile.yaml "
              "(for serve --profile), DIR/report.html and DIR/candidates.jsonl (a re-run resumes from it)");
  cmd->add_option("--model", options->model, "A name in the model dir, a folder or a .gguf file")->required();
  cmd->add_option("--space", options->space_path, "Search space (YAML), e.g. configs/tune/cpu-ci.yaml")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", options->out_dir, "Output folder (created; measured candidates in it are reused)")
      ->required();
  cmd->add_flag("--no-progress{false}", options->progress, "No progress bar on stderr");
  auto random = std::make_shared<bool>(false);
  auto seed = std::make_shared<uint64_t>(1);
  CLI::Option* random_flag = cmd->add_flag("--random-weights", *random,
                "Draw the weights of a Llama-family decoder from --seed (the model folder needs only config.json): "
                "latency and memory of a model shape, quality not measurable");
  cmd->add_option("--seed", *seed, "Seed of --random-weights")->default_val(1)->needs(random_flag);
  cmd->callback([options, random, seed] {
    if (*random) options->random_weights_seed = *seed;
    tuner::run_tune(*options);
  });
}

}  // namespace tessera::cli
