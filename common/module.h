// common/module.h: opens a module Tessera builds as a separate shared object (one that pulls in a heavy
// library only some runs need) and returns its entry point.
#pragma once

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace tessera {

// Looks `module` up on the library path (the run path of the binaries built with it names the build's
// module folder), then beside the running binary and in its ../lib (an installed tree). Returns the
// address of `entry_point`, or nullptr with each place tried and why in `errors`. A module once opened
// stays open: its library's singletons live as long as the process.
inline void* open_module(const char* module, const char* entry_point, std::string* errors) {
  std::vector<std::string> tried{module};
  std::error_code ec;
  const std::filesystem::path exe_dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (!ec) {
    tried.push_back((exe_dir / module).string());
    tried.push_back((exe_dir.parent_path() / "lib" / module).string());
  }
  errors->clear();
  for (const std::string& name : tried) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      if (void* entry = dlsym(handle, entry_point)) return entry;
      *errors += "\n  " + name + " has no " + entry_point;
      continue;
    }
    *errors += std::string("\n  ") + dlerror();
  }
  return nullptr;
}

}  // namespace tessera
