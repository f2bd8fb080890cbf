// kernels/backend/backend.cpp: the Backend calls with a default.
#include "kernels/backend/backend.h"

#include <chrono>

#include "common/error.h"

namespace tessera {

KvCacheStorage make_kv_cache(const char* backend, int64_t num_layers, int32_t num_blocks, int32_t block_size,
                             int32_t num_kv_heads, int32_t head_dim,
                             const std::function<Tensor(std::vector<int64_t>, std::string)>& allocate) {
  TESSERA_CHECK(num_layers >= 1 && num_blocks >= 1 && block_size >= 1 && num_kv_heads >= 1 && head_dim >= 1,
                backend << " create_kv_cache: layers " << num_layers << ", blocks " << num_blocks << ", block_size "
                        << block_size << ", kv heads " << num_kv_heads << ", head_dim " << head_dim
                        << " must all be >= 1");
  KvCacheStorage cache;
  cache.num_blocks = num_blocks;
  cache.block_size = block_size;
  cache.num_kv_heads = num_kv_heads;
  cache.head_dim = head_dim;
  for (int64_t l = 0; l < num_layers; ++l) {
    cache.k.push_back(allocate({num_blocks, block_size, num_kv_heads, head_dim}, "kv.k." + std::to_string(l)));
    cache.v.push_back(allocate({num_blocks, block_size, num_kv_heads, head_dim}, "kv.v." + std::to_string(l)));
  }
  return cache;
}

std::string Backend::describe() const { return std::string(name()) + ": " + scalar_type_name(activation_type()); }

double Backend::time_ms(const std::function<void()>& work) {
  const auto t0 = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Tensor Backend::prepare_step(AttentionPlan& plan, std::span<const int32_t> token_ids) {
  TESSERA_CHECK(static_cast<int64_t>(token_ids.size()) == plan.total_q(),
                name() << " backend: " << token_ids.size() << " token ids for a plan of " << plan.total_q() << " tokens");
  prepare_plan(plan);
  return upload(token_ids, {static_cast<int64_t>(token_ids.size())}, "token_ids");
}

Tensor Backend::step_positions(const AttentionPlan& plan) {
  return upload(plan.positions(), {plan.total_q()}, "positions");
}

std::vector<SampleOutcome> Backend::sample(const Tensor& logits, std::span<const SampleSpec> /*rows*/) {
  TESSERA_FAIL(name() << " backend: sampling of " << logits.describe()
                      << " happens on the host (samples_on_device() is false)");
}

void Backend::all_reduce(Tensor& x) {
  TESSERA_FAIL(name() << " backend: all_reduce of " << x.describe() << ": the backend belongs to no tensor-parallel group");
}

void Backend::all_gather(const Tensor& part, Tensor& whole) {
  TESSERA_FAIL(name() << " backend: all_gather of " << part.describe() << " into " << whole.describe()
                      << ": the backend belongs to no tensor-parallel group");
}

void Backend::check_all_gather(const Tensor& part, const Tensor& whole, int32_t ranks) const {
  TESSERA_CHECK(part.type() == whole.type() && part.shape().size() == 2 && whole.numel() == part.numel() * ranks &&
                    whole.dim(1) == part.dim(1),
                name() << " all_gather: " << whole.describe() << " cannot hold " << ranks << " parts of "
                       << part.describe());
}

void Backend::add(const Tensor& x, Tensor& /*residual*/) {
  TESSERA_FAIL(name() << " backend: no separate add for " << x.describe()
                      << " (fusions.add_rms_norm: false is not available on this backend)");
}

void Backend::concat_columns(std::span<const Tensor* const> /*parts*/, Tensor& out) {
  TESSERA_FAIL(name() << " backend: no column concatenation for " << out.describe()
                      << " (fusions.qkv / fusions.gate_up: separate are not available on this backend)");
}

void Backend::linear_silu_mul(const Tensor& /*x*/, const Tensor& w_gate_up, Tensor& /*out*/) {
  TESSERA_FAIL(name() << " backend: no fused linear + silu_mul for " << w_gate_up.describe()
                      << " (fusions.gate_up: epilogue is not available on this backend)");
}

void Backend::rope_attention(Tensor& qkv, const QkvLayout& /*layout*/, const Tensor& /*inv_freq*/, float /*scale*/,
                             const AttentionPlan& /*plan*/, KvCacheStorage* /*cache*/, int64_t /*layer*/,
                             Tensor& /*out*/) {
  TESSERA_FAIL(name() << " backend: no RoPE fused into the KV write for " << qkv.describe()
                      << " (fusions.rope_kv_write: fused is not available on this backend)");
}

}  // namespace tessera
