// kernels/backend/backend.cpp: the Backend calls with a default.
#include "kernels/backend/backend.h"

#include "common/error.h"

namespace tessera {

Tensor Backend::prepare_step(AttentionPlan& plan, std::span<const int32_t> token_ids) {
  TESSERA_CHECK(static_cast<int64_t>(token_ids.size()) == plan.total_q(),
                name() << " backend: " << token_ids.size() << " token ids for a plan of " << plan.total_q() << " tokens");
  prepare_plan(plan);
  return upload(token_ids, {static_cast<int64_t>(token_ids.size())}, "token_ids");
}

std::vector<SampleOutcome> Backend::sample(const Tensor& logits, std::span<const SampleSpec> /*rows*/) {
  TESSERA_FAIL(name() << " backend: sampling of " << logits.describe()
                      << " happens on the host (samples_on_device() is false)");
}

}  // namespace tessera
