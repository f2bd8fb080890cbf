// kernels/cpu/status.h: the status every CPU kernel returns (kernels never throw).
#pragma once

namespace tessera::kernels::cpu {

enum class Status : int {
  kOk = 0,
  kInvalidShape,     // a size is non-positive or sizes disagree
  kInvalidArgument,  // a null pointer, an out-of-range id or position
  kUnsupported,      // a valid value this kernel does not implement
};

inline const char* status_name(Status status) {
  switch (status) {
    case Status::kOk: return "ok";
    case Status::kInvalidShape: return "invalid shape";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kUnsupported: return "unsupported";
  }
  return "unknown status";
}

}  // namespace tessera::kernels::cpu
