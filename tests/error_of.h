// tests/error_of.h: what the tests check error messages with.
#pragma once

#include <functional>
#include <string>

#include "common/error.h"

namespace tessera {

// The message of the tessera::Error that `call` throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tessera
