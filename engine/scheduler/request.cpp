// engine/scheduler/request.cpp: finish_reason_name (see request.h).
#include "engine/scheduler/request.h"

namespace tessera {

const char* finish_reason_name(RequestFinishReason reason) {
  switch (reason) {
    case RequestFinishReason::kStop: return "stop";
    case RequestFinishReason::kLength: return "length";
    case RequestFinishReason::kCancelled: return "cancelled";
    case RequestFinishReason::kDeadline: return "deadline";
    case RequestFinishReason::kError: return "error";
  }
  return "error";
}

}  // namespace tessera
