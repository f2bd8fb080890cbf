#include "server/cli/commands.h"
#include "common/error.h"
namespace tessera::cli {
void add_info_command(CLI::App& app) {
  app.add_subcommand("info", "not built yet")->callback([] { TESSERA_FAIL("info: not built yet"); });
}
}  // namespace tessera::cli
