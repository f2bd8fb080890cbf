// server/cli/tune_command.cpp: `tessera tune --model M --space configs/tune/<name>.yaml --out DIR`: the
// offline tuner (tuner/tune.h) on this machine's backend.
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
  cmd->callback([options] { tuner::run_tune(*options); });
}

}  // namespace tessera::cli
