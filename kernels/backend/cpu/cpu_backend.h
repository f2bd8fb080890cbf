// kernels/backend/cpu/cpu_backend.h: CpuBackend, the Backend on kernels/cpu: fp32 activations, weight
// matrices in their storage format (GGUF Q8_0 / Q4_0 / Q4_1 blocks, fp16, bf16 or fp32), matmuls on
// the kernel thread pool. The embedded default without a GPU and the oracle for GPU tests.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kernels/backend/backend.h"
#include "kernels/backend/host_collective.h"
#include "kernels/cpu/quant/formats.h"

namespace tessera {

// Tensor memory the backend reuses. Step tensors (activations, logits) are made and dropped every
// step; at sizes over glibc's mmap threshold each was a fresh mmap that the kernel page-faulted and
// zeroed, then unmapped: 60% of the CPU time of a server with 8 streaming clients. Buffers from
// 64 KiB up are kept on release by power-of-two capacity (untouched tail pages of a capacity stay
// unmapped, so rounding costs address space, not memory) and handed out again, up to 128 MiB held
// (a 2048-token prefill step makes about 70 MiB of tensors).
// Thread-safe: a tensor may be dropped on any thread.
class BufferCache {
 public:
  ~BufferCache();
  static size_t capacity_for(size_t bytes);
  void* take(size_t capacity);           // a cached buffer of this capacity, or nullptr
  void give(void* p, size_t capacity);  // keeps it, or frees it when the cache is full
  void release_cached();                 // frees every cached buffer
  // A new buffer of `capacity` bytes, 64-byte aligned. From kMinMapped up it is an anonymous map of
  // its own, whose pages the OS zero-fills on first touch: *zeroed is set, and pages never written
  // take no memory (the blocks of a KV cache no request has reached yet, a capacity's rounded-up
  // tail), where malloc's heap may hand back dirty pages that a memset makes resident. Smaller
  // ones come from malloc. release() frees either kind by its capacity.
  static void* allocate(size_t capacity, bool* zeroed);
  static void release(void* p, size_t capacity);

 private:
  static constexpr size_t kMinCached = size_t{64} << 10;
  static constexpr size_t kMinMapped = size_t{1} << 20;
  static constexpr size_t kMaxCachedBytes = size_t{128} << 20;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  size_t cached_bytes_ = 0;
};

struct CpuBackendOptions {
  int num_threads = 0;  // <= 0: OMP_NUM_THREADS or the core count
  // Weight matrices stay in their storage format (Q8_0, Q4_0, Q4_1, F16, BF16) and the matmuls read
  // them in place. false dequantizes every weight to fp32 at load: the reference the quantized path
  // is checked against, at several times the memory.
  bool keep_weight_formats = true;
  // Block-format matrices of a whole number of 8-row groups are rearranged at load into their
  // interleaved form (kernels/cpu/quant/formats.h), same bytes, 2-3x the matmul speed. false keeps
  // the file's row layout.
  bool interleave_block_weights = true;
  // Precision of the activations that the block-format matmuls quantize on the fly, per block of 32
  // (kernels/cpu/quant/q8_rows.h): 16 or 8 (llama.cpp's). On SmolLM2 Q4_1, top-1 agreement with
  // the fp32 path over 10k positions: 16-bit 100.00%, 8-bit 96.67%. 16-bit costs a few % in
  // single-sequence decode (weight traffic bounds it) and up to 2x in matmuls of many rows
  // (prefill, batched decode; bench/NOTES.md). The constructor rejects any other value.
  int32_t activation_bits = 16;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads = 0);
  explicit CpuBackend(const CpuBackendOptions& options);

  const char* name() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::kCpu; }
  ScalarType activation_type() const override { return ScalarType::kF32; }
  // "cpu: f32, kernels avx512vnni, 16-bit block activations, weights f32 x61 (0.1 MiB), q4_1 x120
  // (63.3 MiB), q8_0 x1 (28.7 MiB)".
  std::string describe() const override;
  // Weight tensors loaded so far by the format they are kept in: count and bytes.
  struct FormatUse {
    int64_t tensors = 0;
    int64_t bytes = 0;
  };
  const std::map<std::string, FormatUse>& weight_formats() const { return weight_formats_; }
  // The same per tensor group: layer indices in names become {L} ("model.layers.{L}.qkv"), so each
  // entry is one kind of weight across layers, with the format it is kept in (for `tessera info`).
  struct WeightGroup {
    std::string group;
    std::string format;
    FormatUse use;
  };
  std::vector<WeightGroup> weight_groups() const;

  void release_step_memory() override;
  Tensor empty(std::vector<int64_t> shape, ScalarType type, std::string name) override;
  Tensor upload(std::span<const float> host, std::vector<int64_t> shape, std::string name) override;
  Tensor upload(std::span<const int32_t> host, std::vector<int64_t> shape, std::string name) override;
  std::vector<float> download(const Tensor& tensor) override;

  Tensor load_weight(const WeightView& weight, std::vector<int64_t> shape, WeightUse use) override;
  Tensor load_stacked(std::span<const WeightView* const> parts, std::span<const std::vector<int64_t>> shapes,
                      std::string fused_name, WeightUse use) override;

  KvCacheStorage create_kv_cache(int64_t num_layers, int32_t num_blocks, int32_t block_size,
                                 int32_t num_kv_heads, int32_t head_dim) override;
  void prepare_plan(AttentionPlan& plan) override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool accumulate) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) override;
  void layer_norm(Tensor& x, const Tensor* residual, const Tensor& w, const Tensor& b, float eps) override;
  void rope(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, const AttentionPlan& plan) override;
  void copy_kv_rows(KvCacheStorage& cache, std::span<const int32_t> src_slots, std::span<const int32_t> dst_slots,
                    std::span<const int32_t> rotate_by, const Tensor& inv_freq) override;
  void attention(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                 KvCacheStorage* cache, int64_t layer, Tensor& out) override;
  bool runs_unfused_graphs() const override { return true; }
  void add(const Tensor& x, Tensor& residual) override;
  void concat_columns(std::span<const Tensor* const> parts, Tensor& out) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void gelu(Tensor& x) override;
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void pool(const Tensor& x, const AttentionPlan& plan, PoolMode mode, Tensor& out) override;
  void l2_normalize(Tensor& x) override;
  void softmax(Tensor& x) override;

  // Makes this backend rank `rank` of `group`: all_reduce then sums over the group's backends, each
  // driven by its own thread.
  void join_group(std::shared_ptr<HostCollective> group, int32_t rank);
  int32_t tensor_parallel_size() const override { return group_ ? group_->size() : 1; }
  int32_t tensor_parallel_rank() const override { return rank_; }
  void all_reduce(Tensor& x) override;
  void all_gather(const Tensor& part, Tensor& whole) override;
  void abort_collectives() override;
  // After the group was aborted (a rank failed), what happened: the engine stops as after a device
  // error.
  std::string failure() const override;

 private:
  Tensor record_weight(Tensor t);
  // Whether a kept matrix of this type and row count is stored interleaved.
  bool interleaves(ScalarType type, int64_t rows) const;
  // `rows` rows of the file's bytes `src` into `dst` (inside t), interleaved when interleaves() says so.
  void copy_weight_rows(const Tensor& t, const std::byte* src, int64_t rows, std::byte* dst);
  // Records whether t's data is interleaved (linear and embedding pick the kernel format by it).
  void mark_layout(const Tensor& t, bool interleaved);
  // The kernels' format for a weight (the interleaved formats by their data pointers).
  kernels::cpu::WeightFormat weight_format(const Tensor& w, const char* op) const;

  CpuBackendOptions options_;
  std::shared_ptr<BufferCache> buffers_;
  std::map<std::string, FormatUse> weight_formats_;
  std::map<std::pair<std::string, std::string>, FormatUse> weight_groups_;  // (group, format)
  std::unordered_set<const void*> interleaved_;  // data of the weights interleave_if_block rearranged
  std::shared_ptr<HostCollective> group_;
  int32_t rank_ = 0;
};

}  // namespace tessera
