// tests/unit/http/api_error_of.h: the ApiError a request parse throws, for the front-end tests.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "server/frontend/api_error.h"

namespace tessera::http {

struct Caught {
  ErrorKind kind = ErrorKind::kInternal;
  std::string param;
  std::string message;
};

// What `fn` throws as an ApiError; a test failure when it throws none.
template <typename Fn>
Caught catch_api_error(Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return {e.kind(), e.param(), e.what()};
  }
  ADD_FAILURE() << "no ApiError thrown";
  return {};
}

}  // namespace tessera::http
