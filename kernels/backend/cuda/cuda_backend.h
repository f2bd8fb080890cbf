// kernels/backend/cuda/cuda_backend.h: CudaBackend, the Backend on one CUDA GPU: bf16 (or fp16)
// activations, weights and KV cache with fp32 accumulation, cuBLASLt GEMMs and the kernels of
// kernels/cuda, all enqueued on one stream.
//
// Memory: weights, tables and the KV cache are device allocations made at load. Everything a step
// makes (activations, gathered K/V, logits) comes from one step workspace that is reset by each
// prepare_step. The engine runs its largest step once at start (Executor::warm_up), which sizes the
// workspace; a later step that outgrows it still runs, after one reallocation that is counted.
// The plan's arrays go up in one host-to-device copy per step.
//
// Errors: every launch is checked; a failure throws tessera::Error naming the op and the tensor. A
// sticky CUDA error (the context is unusable, e.g. an illegal address) also marks the backend
// failed: failure() tells what happened, and every later call throws at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kernels/backend/backend.h"

namespace tessera {

struct CudaBackendConfig {
  int device = 0;
  ScalarType dtype = ScalarType::kBF16;  // kBF16 or kF16
  bool cuda_graphs = true;               // capture decode-only steps and one-text encodes into CUDA graphs
  // The format the layers' linear weights (WeightUse::kLinear) are kept in: `dtype` itself
  // (unquantized, the default), or a weight-only format of kernels/cuda/gemm/quantized_weights.h:
  // kInt8PerRow, kInt4G128, kFp8E4M3PerRow, which need dtype kBF16 (their kernels take bf16
  // activations). Embeddings, the lm_head, norms and biases always stay in `dtype`. A linear weight
  // whose shape the format cannot hold (k not a multiple of 16, or of 32 for int4_g128) is refused
  // at load, naming it: no real model has one, and keeping it unquantized would silently measure
  // another configuration than the one asked for.
  ScalarType linear_weights = ScalarType::kBF16;
  // Decode attention's shortest split-KV chunk, in tokens (kernels/cuda/attention/attention.h,
  // DecodeArgs::min_split_tokens): 0 for the kernel's default, or a multiple of 32 in [32, 1024].
  int32_t decode_split_min_tokens = 0;
  // The paged KV cache's element type: unset (or `dtype`) keeps it in the activation dtype;
  // ScalarType::kFp8E4M3 stores OCP e4m3 bytes with scale 1.0 (half the bytes, so twice the tokens
  // in the same memory, and half the KV traffic of a decode step), written by the KV appends and
  // widened back to bf16 by every kernel that reads the cache. Needs dtype kBF16 (the fp8-KV kernels
  // are compiled for bf16 activations only).
  std::optional<ScalarType> kv_cache_dtype;
  // Decode steps of one request's rows (a lone decode, or a verify's tokens: AttentionPlan::
  // one_request) of up to 8 rows run every GEMV on the row-streaming kernel (whose rows are the bits
  // a batch of one gets, with or without this: gemv.h) and plan each row's attention split as if it
  // decoded alone (DecodeArgs::split_as_one_sequence), so that a row's logits do not depend on the
  // rows beside it: a server that speculates sets it, so that a lone request's verify gives the
  // tokens decoding without speculation gives. Steps of several requests' rows run as without it
  // (their bits depend on the batch either way); on the H100 the invariant kernels cost up to a
  // fifth of an 8-row SmolLM2 step.
  bool batch_invariant_decode = false;
  // In a tensor-parallel group whose GPUs reach each other's memory: the one-shot all-reduce kernel
  // (kernels/cuda/collectives) for small messages, or NCCL for every all-reduce. Every rank of the
  // group must ask for it.
  bool oneshot_allreduce = true;
  void validate() const;                 // throws naming the field
};

// The GPUs this process can see (0 when there is no driver or no device); never throws.
int cuda_device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"; throws when the device does not exist.
std::string cuda_device_description(int device);

class CudaBackend final : public Backend {
 public:
  // Throws tessera::Error with a clear message when no GPU is visible or the device is out of range.
  explicit CudaBackend(CudaBackendConfig config = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  DeviceKind device() const override { return DeviceKind::kCuda; }
  ScalarType activation_type() const override;
  ScalarType kv_cache_type() const override;

  std::string failure() const override;
  // Steps (decode steps, one-text encodes) replayed from a captured CUDA graph, and graphs captured,
  // since start.
  int64_t graph_replays() const;
  int64_t graphs_captured() const;
  // Times the step workspace, staging or decode buffers grew while graphs were captured (each drops
  // them all); 0 when the start-up warm-up sized the buffers.
  int64_t workspace_regrowths() const;
  // Linears of more rows than the GEMV kernels take on quantized weights, since start: on a kernel
  // that reads the quantized weight (int8 and fp8_e4m3 as W8A8 on the int8 or FP8 tensor cores,
  // int4_g128 on the mixed-input GEMM), and on the weight expanded to bf16 (shapes none of those
  // takes). Tells which path a shape took.
  int64_t quantized_gemms() const;
  int64_t dequantized_gemms() const;
  // Bytes of the bf16 buffer quantized weights are expanded into (0 while every shape ran on a
  // kernel that reads the quantized weight).
  int64_t dense_weight_buffer_bytes() const;
  // "cuda: NVIDIA H100 ... (sm_90, 132 SMs, 79.2 GiB), bf16, linear weights int4_g128, weights 0.25 GiB,
  // KV cache bf16 0.35 GiB, free 78 GiB" (KV cache fp8_e4m3 with an fp8 cache)
  std::string describe() const override;
  std::string attention_unsupported(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim) const override;
  std::optional<int64_t> free_device_bytes() const override;
  std::string device_description() const;
  // Bytes of every weight loaded so far, as stored on the device (quantized ones with their scales).
  int64_t weight_bytes() const;

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
  Tensor prepare_step(AttentionPlan& plan, std::span<const int32_t> token_ids) override;
  Tensor step_positions(const AttentionPlan& plan) override;
  // Decode-only steps and encoder forwards of one sequence: the first of a shape (batch size and
  // block-table bucket, or the sequence's length) runs eagerly, the second is captured into a CUDA
  // graph, and later ones replay it.
  Tensor run_step(const void* owner, const std::function<Tensor()>& forward) override;
  // 1, 2, 4, 8, then steps of a third to a half of the size (12, 16, 24, 32, 48, 64, 96, ...) up
  // to max_batch: padding a decode step costs little next to streaming the weights. Empty with graphs
  // off.
  std::vector<int32_t> decode_batch_ladder(int32_t max_batch) const override;
  bool sizes_workspace_at_start() const override { return true; }
  // CUDA events on the backend's stream around `work`.
  double time_ms(const std::function<void()>& work) override;

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
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  // gate_up_epilogue: up to kGemvMaxM (8) rows, the (quantized) GEMV with silu(gate) · up in its
  // epilogue over a weight in pairs order (load_stacked with WeightUse::kGateUpSiluMul interleaves
  // gate and up rows: kernels/cuda/gemm/gemv.h); above, and for dense weights on the tensor-core
  // GEMV's 2-8 rows, the GEMM (or GEMV) then silu_mul over the pairs.
  bool runs_gate_up_epilogue() const override { return true; }
  void linear_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& out) override;
  // rope_in_kv_write: in a step where every row decodes, with a paged cache, one kernel rotates q and
  // writes rotated K and V to the cache (kv_cache_append_rope), replacing rope's and
  // kv_cache_append's launches; otherwise rope then attention, with the same bits.
  bool runs_rope_in_kv_write() const override { return true; }
  void rope_attention(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, float scale,
                      const AttentionPlan& plan, KvCacheStorage* cache, int64_t layer, Tensor& out) override;
  // Unfused graphs (the tuner's fusions.add_rms_norm / qkv / gate_up: separate): the residual add
  // alone (one element-wise kernel) and separate projections joined with one strided copy each.
  bool runs_unfused_graphs() const override { return true; }
  void add(const Tensor& x, Tensor& residual) override;
  void concat_columns(std::span<const Tensor* const> parts, Tensor& out) override;
  void gelu(Tensor& x) override;
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void pool(const Tensor& x, const AttentionPlan& plan, PoolMode mode, Tensor& out) override;
  void l2_normalize(Tensor& x) override;
  void softmax(Tensor& x) override;

  // Makes `ranks` one tensor-parallel group, rank i being ranks[i]: one NCCL communicator each, over
  // their devices, which must be distinct. Throws naming the devices when NCCL cannot set it up.
  static void form_group(std::span<CudaBackend* const> ranks);
  int32_t tensor_parallel_size() const override;
  int32_t tensor_parallel_rank() const override;
  // ncclAllReduce (sum) on the backend's stream; a captured decode step captures it too.
  void all_reduce(Tensor& x) override;
  void all_gather(const Tensor& part, Tensor& whole) override;
  // The one-shot kernel over NVLink (kernels/cuda/collectives) where the group has peer access and
  // the message fits it (up to 128 rows and 1 MiB: decode steps); NCCL then fused_add_rmsnorm
  // otherwise (prefill).
  void all_reduce_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) override;
  // ncclCommAbort: the group's kernels in flight end, and the backend is failed from then on.
  void abort_collectives() override;

  bool samples_on_device() const override { return true; }
  std::vector<SampleOutcome> sample(const Tensor& logits, std::span<const SampleSpec> rows) override;

 private:
  // attention(), or with rope_inv_freq (rope_attention, paged) q rotated and K rotated into the cache.
  void attend(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan, KvCacheStorage* cache,
              int64_t layer, Tensor& out, const Tensor* rope_inv_freq);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
