#include "server/cli/commands.h"
#include "common/error.h"
namespace tessera::cli {
void add_tokenize_command(CLI::App& app) {
  app.add_subcommand("tokenize", "not built yet")->callback([] { TESSERA_FAIL("tokenize: not built yet"); });
}
}  // namespace tessera::cli
