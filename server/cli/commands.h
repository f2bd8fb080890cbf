// server/cli/commands.h: the `tessera` subcommands; each adds itself to the CLI app.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::cli {

void add_info_command(CLI::App& app);      // tessera info --model M
void add_tokenize_command(CLI::App& app);  // tessera tokenize --model M (--text T | --lines F)
void add_generate_command(CLI::App& app);  // tessera generate --model M (--prompt P | --chat MSG) [...]
void add_embed_command(CLI::App& app);     // tessera embed --model M TEXT...
void add_serve_command(CLI::App& app);     // tessera serve --config F [--set k=v]... [--model M]... [--profile P]
void add_tune_command(CLI::App& app);      // tessera tune --model M --space S --out DIR

}  // namespace tessera::cli
