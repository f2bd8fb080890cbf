// common/error.h: Tessera's error type and the boundary-check macro used above kernels/.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

// Thrown for invalid input or an unusable file. The message is meant for a user: it names the
// file, tensor or field and says what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] inline void fail_check(const char* expr, const char* func, const char* file, int line,
                                    const std::string& message) {
  std::ostringstream os;
  os << message << " [check `" << expr << "` failed in " << func << " at " << file << ":" << line << "]";
  throw Error(os.str());
}
}  // namespace detail

}  // namespace tessera

// TESSERA_CHECK(cond, "stream" << "able" << message): throws tessera::Error naming the failing
// expression, function and location. For input validation, never for internal invariants that
// cannot fail.
#define TESSERA_CHECK(cond, msg)                                                                 \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::ostringstream tessera_check_os_;                                                      \
      tessera_check_os_ << msg;                                                                  \
      ::tessera::detail::fail_check(#cond, __func__, __FILE__, __LINE__, tessera_check_os_.str()); \
    }                                                                                            \
  } while (0)

#define TESSERA_FAIL(msg)                                                                   \
  do {                                                                                      \
    std::ostringstream tessera_check_os_;                                                   \
    tessera_check_os_ << msg;                                                               \
    throw ::tessera::Error(tessera_check_os_.str());                                        \
  } while (0)
