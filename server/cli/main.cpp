// server/cli/main.cpp: the `tessera` binary: one subcommand per job.
#include <cstdio>
#include <exception>

#include "common/error.h"
#include "server/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Tessera: LLM inference server with programmable attention"};
  app.require_subcommand(1);
  tessera::cli::add_info_command(app);
  tessera::cli::add_tokenize_command(app);
  tessera::cli::add_generate_command(app);
  tessera::cli::add_embed_command(app);
  tessera::cli::add_tune_command(app);
  tessera::cli::add_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
