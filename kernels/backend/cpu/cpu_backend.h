// kernels/backend/cpu/cpu_backend.h: CpuBackend, the fp32 Backend on kernels/cpu (OpenBLAS GEMM, OpenMP threads).
// The embedded default without a GPU and the oracle for GPU tests.
#pragma once

#include "kernels/backend/backend.h"

namespace tessera {

class CpuBackend final : public Backend {
 public:
  // num_threads <= 0 keeps OpenMP's default (OMP_NUM_THREADS or the core count).
  explicit CpuBackend(int num_threads = 0);

  const char* name() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::kCpu; }
  ScalarType activation_type() const override { return ScalarType::kF32; }

  Tensor empty(std::vector<int64_t> shape, ScalarType type, std::string name) override;
  Tensor upload(std::span<const float> host, std::vector<int64_t> shape, std::string name) override;
  Tensor upload(std::span<const int32_t> host, std::vector<int64_t> shape, std::string name) override;
  std::vector<float> download(const Tensor& tensor) override;

  Tensor load_weight(const WeightView& weight, std::vector<int64_t> shape) override;
  Tensor load_stacked(std::span<const WeightView* const> parts, std::span<const std::vector<int64_t>> shapes,
                      std::string fused_name) override;

  KvCacheStorage create_kv_cache(int64_t num_layers, int32_t num_blocks, int32_t block_size,
                                 int32_t num_kv_heads, int32_t head_dim) override;
  void prepare_plan(AttentionPlan& plan) override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool accumulate) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) override;
  void layer_norm(Tensor& x, const Tensor* residual, const Tensor& w, const Tensor& b, float eps) override;
  void rope(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, const AttentionPlan& plan) override;
  void attention(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                 KvCacheStorage* cache, int64_t layer, Tensor& out) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void gelu(Tensor& x) override;
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void pool(const Tensor& x, const AttentionPlan& plan, PoolMode mode, Tensor& out) override;
  void l2_normalize(Tensor& x) override;
  void softmax(Tensor& x) override;
};

}  // namespace tessera
