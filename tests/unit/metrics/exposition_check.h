// tests/unit/metrics/exposition_check.h: runs an exposition through the Python prometheus_client
// parser (check_exposition.py) and through `promtool check metrics`.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace tessera::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string write_temp(const std::string& text, const std::string& suffix) {
  std::string path = "/tmp/tessera-metrics-test-" + std::to_string(getpid()) + "-" + suffix;
  std::ofstream(path) << text;
  return path;
}

// Every line of promtool's lint output is the one finding Tessera keeps by design: vLLM's metric
// names carry the `tessera:` prefix (as vLLM's carry `vllm:`), which promtool's naming lint flags.
// Parse errors (exit 1) or any other finding fail.
inline bool promtool_only_colon_findings(const CommandResult& r) {
  if (r.exit_code == 0) return true;
  if (r.exit_code != 3) return false;
  size_t start = 0;
  while (start < r.output.size()) {
    size_t end = r.output.find('\n', start);
    if (end == std::string::npos) end = r.output.size();
    const std::string line = r.output.substr(start, end - start);
    if (!line.empty() && line.find("metric names should not contain ':'") == std::string::npos) return false;
    start = end + 1;
  }
  return true;
}

}  // namespace tessera::testing
