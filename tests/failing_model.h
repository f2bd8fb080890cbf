// tests/failing_model.h: FailingForward, a CausalLm that runs another's graph and throws on its N-th
// forward, before launching anything: a rank that fails while the others wait for it in a
// collective.
#pragma once

#include <memory>
#include <string>

#include "common/error.h"
#include "models/model.h"

namespace tessera::test {

class FailingForward : public CausalLm {
 public:
  FailingForward(std::unique_ptr<CausalLm> inner, int fail_at) : inner_(std::move(inner)), fail_at_(fail_at) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t cache_kv_heads() const override { return inner_->cache_kv_heads(); }
  Tensor forward(const ForwardBatch& batch, KvCacheStorage* cache, std::span<const int32_t> logit_rows,
                 const TensorObserver* observer = nullptr) override {
    TESSERA_CHECK(++calls_ != fail_at_, "injected failure in forward " << calls_);
    return inner_->forward(batch, cache, logit_rows, observer);
  }
  void copy_kv(KvCacheStorage& cache, std::span<const int32_t> src_slots, std::span<const int32_t> dst_slots,
               std::span<const int32_t> rotate_by) override {
    inner_->copy_kv(cache, src_slots, dst_slots, rotate_by);
  }

 private:
  std::unique_ptr<CausalLm> inner_;
  const int fail_at_;
  int calls_ = 0;
};

}  // namespace tessera::test
