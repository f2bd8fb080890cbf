// kernels/backend/backend.h: Backend, the ops the model graphs (Llama, Mistral, BERT) run on, and the paged
// KV cache storage it owns. CpuBackend (kernels/backend/cpu) implements it in fp32; a CudaBackend
// implements the same calls with device buffers and a stream, so model code never changes.
//
// Thread safety: none. One engine thread owns a backend and makes every call, in order (a GPU
// backend enqueues them on its stream; download() synchronises).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend/attention_plan.h"
#include "kernels/backend/tensor.h"
#include "kernels/backend/weight_view.h"

namespace tessera {

// Where q, k and v sit inside a fused QKV projection row: [q heads | k heads | v heads].
struct QkvLayout {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t q_offset() const { return 0; }
  int64_t k_offset() const { return static_cast<int64_t>(num_heads) * head_dim; }
  int64_t v_offset() const { return static_cast<int64_t>(num_heads + num_kv_heads) * head_dim; }
  int64_t row_width() const { return static_cast<int64_t>(num_heads + 2 * num_kv_heads) * head_dim; }
};

// K and V of every layer in the paged layout shared with the kernels:
// k[layer], v[layer]: [num_blocks, block_size, num_kv_heads, head_dim]. Which blocks a sequence
// holds is the KvBlockPool's business (engine/kv_cache); this is only the memory.
struct KvCacheStorage {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  std::vector<Tensor> k;  // [num_layers] of [num_blocks, block_size, num_kv_heads, head_dim]
  std::vector<Tensor> v;
  int64_t num_layers() const { return static_cast<int64_t>(k.size()); }
};

// The checks and layout every backend's create_kv_cache shares: K and V tensors per layer, each made
// by `allocate(shape, name)`. Throws naming the field when a dimension is < 1.
KvCacheStorage make_kv_cache(const char* backend, int64_t num_layers, int32_t num_blocks, int32_t block_size,
                             int32_t num_kv_heads, int32_t head_dim,
                             const std::function<Tensor(std::vector<int64_t>, std::string)>& allocate);

enum class PoolMode { kMean, kCls };

// What a loaded weight is for. Only kLinear weights (a layer's q/k/v/o, gate/up/down, BERT's layer
// linears: read by nothing but Backend::linear) may be stored in a weight-only quantized format.
// Embedding tables, the lm_head (tied or not), norms and biases are kOther and stay in the
// activation dtype, as AWQ, GPTQ and Marlin keep them: the lm_head's error lands straight on the
// logits, and the embedding is a gather, not a GEMM.
//
// kGateUpSiluMul: a layer's gate and up projections stacked (load_stacked, [gate; up]) for nothing
// but linear_silu_mul. Like kLinear it may be quantized; its row order is the backend's own (the CUDA
// backend interleaves gate and up rows so that one GEMV block computes both halves of an output), so
// linear() must not read it.
enum class WeightUse { kLinear, kOther, kGateUpSiluMul };

// One logits row's sampling settings for Backend::sample: plain values that the engine's per-request
// Sampler fills (engine/sampler/sampler.h has the semantics and the order of the transforms).
struct SampleSpec {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  double uniform = 0.0;            // the draw's u in [0, 1), from the request's seeded RNG
  int32_t num_top_logprobs = -1;   // -1: no logprobs
  std::span<const int32_t> penalty_tokens;  // each at most once: prompt and generated tokens
  std::span<const int32_t> penalty_counts;  // times each was generated (0: prompt only)
  // Tokens given probability 0 before anything else (logprobs included): min_tokens' stop ids.
  std::span<const int32_t> masked_tokens;
  // Constrained decoding: when not empty, ceil(vocab / 32) words where bit t % 32 of word t / 32 is
  // set for each token t the grammar allows; every other token gets probability 0 before anything
  // else, as masked_tokens do (so logprobs are those of the constrained distribution).
  std::span<const int32_t> allowed_tokens;
};

struct SampleOutcome {
  int32_t token = -1;
  float logprob = 0.0f;  // raw-distribution log p(token); NaN without logprobs
  std::vector<std::pair<int32_t, float>> top;  // num_top_logprobs alternatives, most likely first
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual DeviceKind device() const = 0;
  // The dtype of activations, weights and (unless kv_cache_type says otherwise) the KV cache (f32 on
  // the CPU, bf16 or f16 on a GPU). The graphs allocate their activations in it.
  virtual ScalarType activation_type() const = 0;
  // The element type create_kv_cache stores K and V in: the activation type, or on the CUDA backend
  // e4m3 (CudaBackendConfig::kv_cache_dtype). What sizes the cache per token.
  virtual ScalarType kv_cache_type() const { return activation_type(); }
  // One line for logs and `tessera info`: "cpu: f32", or for a GPU the device, dtype and memory.
  virtual std::string describe() const;
  // Device memory free now, in bytes; nullopt for a backend in host memory.
  virtual std::optional<int64_t> free_device_bytes() const { return std::nullopt; }
  // Empty while the backend works; after an unrecoverable device error (a sticky CUDA error), what
  // happened. Every later call then throws, so the engine stops and the process must restart.
  virtual std::string failure() const { return {}; }
  // Why this backend has no attention kernel for heads of this shape, or "": asked when a model
  // loads, so that such a model fails there, by name, rather than at its first request.
  virtual std::string attention_unsupported(int32_t /*num_heads*/, int32_t /*num_kv_heads*/,
                                            int32_t /*head_dim*/) const {
    return {};
  }

  // --- memory ---
  // empty() and upload() made after prepare_plan are step scratch on a GPU backend (one workspace
  // reused every step, no allocation per step): valid until the next prepare_plan. Made before the
  // first prepare_plan (weights, tables), they live as long as their Tensor.
  virtual Tensor empty(std::vector<int64_t> shape, ScalarType type, std::string name) = 0;
  virtual Tensor upload(std::span<const float> host, std::vector<int64_t> shape, std::string name) = 0;
  virtual Tensor upload(std::span<const int32_t> host, std::vector<int64_t> shape, std::string name) = 0;
  // Any float tensor comes back as fp32 (the stream is synchronised first).
  virtual std::vector<float> download(const Tensor& tensor) = 0;

  // --- weights ---
  // A weight as stored, in the backend's compute format (fp32 on the CPU; quantized GGUF tensors are
  // dequantized here). `use` says whether it is a layer's linear weight, which a backend may keep in
  // a weight-only quantized format (CudaBackendConfig::linear_weights). Throws naming the tensor
  // when its shape differs from `shape`.
  virtual Tensor load_weight(const WeightView& weight, std::vector<int64_t> shape, WeightUse use) = 0;
  // Several [rows_i, cols] (or 1-D [rows_i]) weights stacked along rows into one (fused QKV and
  // gate-up projections, fused QKV biases).
  virtual Tensor load_stacked(std::span<const WeightView* const> parts, std::span<const std::vector<int64_t>> shapes,
                              std::string fused_name, WeightUse use) = 0;

  // --- per-step state ---
  virtual KvCacheStorage create_kv_cache(int64_t num_layers, int32_t num_blocks, int32_t block_size,
                                         int32_t num_kv_heads, int32_t head_dim) = 0;
  // Called once per step after the plan is built (a GPU backend uploads its arrays here).
  virtual void prepare_plan(AttentionPlan& plan) = 0;
  // The same, with the step's token ids sent up in the same copy; returns them on the backend
  // (i32 [plan.total_q()]), for ForwardBatch::device_token_ids.
  virtual Tensor prepare_step(AttentionPlan& plan, std::span<const int32_t> token_ids);
  // The plan's positions on the backend (i32 [plan.total_q()]): a prepared step's own copy on a GPU,
  // which a captured forward may read; an upload by default.
  virtual Tensor step_positions(const AttentionPlan& plan);
  // Runs one step's forward. A GPU backend may capture a decode-only step (one query per sequence), or
  // an encoder's forward of one sequence, into a CUDA graph and replay it for later steps of the same
  // shape and `owner`, so `forward` must read nothing but the prepared step's device inputs
  // (prepare_step, step_positions) and the weights and cache.
  // `owner` names what the forward computes with (a model and its KV cache: the cache's address),
  // so that two models served on one backend never replay each other's graphs. The default calls
  // forward.
  virtual Tensor run_step(const void* owner, const std::function<Tensor()>& forward) {
    (void)owner;
    return forward();
  }
  // The batch sizes a decode-only step is padded up to, so that every step replays a graph captured
  // at start (Executor::warm_up); empty when the backend runs steps as they come. Sizes go up to
  // max_batch, which is the last entry.
  virtual std::vector<int32_t> decode_batch_ladder(int32_t max_batch) const {
    (void)max_batch;
    return {};
  }
  // True when the backend wants the largest step run once at start, so that its step workspace is
  // sized before serving instead of growing under load (a GPU backend; not the CPU's heap).
  virtual bool sizes_workspace_at_start() const { return false; }
  // Milliseconds that `work` takes where the backend runs it, for benchmarks and the tuner: wall time
  // by default; a GPU backend times its stream with events. `work` must end by waiting for its
  // results (a download), so that both clocks cover all of it.
  virtual double time_ms(const std::function<void()>& work);
  // Hands back the memory kept between steps for reuse (the CPU backend's cached step buffers: up to
  // 128 MiB after long prefills). The engine calls it from its step thread once it has been idle a
  // second, so an idle server holds its weights and KV cache, not the last burst's scratch. A GPU
  // backend keeps its workspace, which is sized at start on purpose.
  virtual void release_step_memory() {}

  // --- ops (shapes are checked; errors name the tensors) ---
  // out[i] (+)= table[ids[i]]. ids: i32[n]; table: [vocab, dim]; out: [n, dim].
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool accumulate) = 0;
  // y = x · wᵀ (+ bias). x: [n, in]; w: [out, in]; bias: [out] or null; y: [n, out].
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) = 0;
  // out = rmsnorm(x) * w. x, out: [n, dim].
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;
  // residual <- x + residual; x <- rmsnorm(residual) * w. x, residual: [n, dim].
  virtual void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) = 0;
  // x <- layernorm(x + residual) * w + b (residual may be null). x: [n, dim].
  virtual void layer_norm(Tensor& x, const Tensor* residual, const Tensor& w, const Tensor& b, float eps) = 0;
  // RoPE in place on the q and k heads of a fused QKV tensor [n, layout.row_width()], at the plan's
  // positions. inv_freq: [head_dim / 2].
  virtual void rope(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, const AttentionPlan& plan) = 0;
  // In every layer of `cache`, the K/V rows of slots src_slots[r] are copied to dst_slots[r], K
  // rotated by rotate_by[r] RoPE positions (0: unchanged): a cached document's K/V moved to another
  // position. Source and destination slots must be disjoint. inv_freq: [head_dim / 2].
  virtual void copy_kv_rows(KvCacheStorage& cache, std::span<const int32_t> src_slots,
                            std::span<const int32_t> dst_slots, std::span<const int32_t> rotate_by,
                            const Tensor& inv_freq) = 0;
  // Attention of the plan's packed batch. With a cache (plan.paged()), this step's k and v are first
  // written to `layer`'s blocks and every query reads the paged cache; without one, the packed k and
  // v of this step. qkv: [n, layout.row_width()]; out: [n, num_heads * head_dim]. scale: usually
  // 1/sqrt(head_dim).
  virtual void attention(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                         KvCacheStorage* cache, int64_t layer, Tensor& out) = 0;
  // --- unfused forms (the tuner's fusion switches; models/graph_options.h) ---
  // True when add() and concat_columns() run: a graph may then be built with fusions switched off.
  // The defaults throw, so a backend without them refuses those graph options by name.
  virtual bool runs_unfused_graphs() const { return false; }
  // residual <- residual + x (the add of add_rms_norm, alone). x, residual: [n, dim].
  virtual void add(const Tensor& x, Tensor& residual);
  // out = [parts[0] | parts[1] | ...] along columns (separate q/k/v or gate/up projections joined for
  // the ops that read them fused). parts[i]: [n, cols_i]; out: [n, sum cols_i].
  virtual void concat_columns(std::span<const Tensor* const> parts, Tensor& out);
  // out = silu(gate) * up. gate_up: [n, 2 * dim] as [gate | up]; out: [n, dim].
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;

  // --- fused forms beyond the default graph (the tuner's fusions.gate_up: epilogue and
  // fusions.rope_kv_write: fused; models/graph_options.h). The defaults throw naming the field, so
  // a backend without them refuses those graph options by name.
  // True when linear_silu_mul runs (and load_stacked takes WeightUse::kGateUpSiluMul).
  virtual bool runs_gate_up_epilogue() const { return false; }
  // out = silu(x · gateᵀ) * (x · upᵀ): linear then silu_mul in one op, the SiLU·mul in the GEMM's
  // epilogue where the backend can. x: [n, in]; w_gate_up: [2 * dim, in], loaded by load_stacked
  // from [gate_proj, up_proj] with WeightUse::kGateUpSiluMul; out: [n, dim].
  virtual void linear_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& out);
  // True when rope_attention runs.
  virtual bool runs_rope_in_kv_write() const { return false; }
  // rope() then attention(), with K rotated as it is written to the paged cache: q is rotated in
  // place in qkv; with a cache the k columns of qkv are left unrotated (only the cache's copy is
  // rotated, and attention reads K from the cache); without one, k is rotated in place as rope()
  // does. Arguments as for rope() and attention().
  virtual void rope_attention(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, float scale,
                              const AttentionPlan& plan, KvCacheStorage* cache, int64_t layer, Tensor& out);
  // x <- gelu(x), the exact (erf) form.
  virtual void gelu(Tensor& x) = 0;
  // out[i] = x[rows[i]]. x: [n, dim]; out: [rows.size(), dim].
  virtual void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) = 0;
  // Per sequence of the plan: mean of its rows or its first row. x: [n, dim]; out: [num_seqs, dim].
  virtual void pool(const Tensor& x, const AttentionPlan& plan, PoolMode mode, Tensor& out) = 0;
  virtual void l2_normalize(Tensor& x) = 0;  // per row
  virtual void softmax(Tensor& x) = 0;       // per row

  // --- tensor parallelism (one model's heads and FFN columns split over the ranks of a group) ---
  // The ranks of the group this backend belongs to (1 when it belongs to none), and its own rank in
  // [0, size). A model graph loaded on a backend of a group loads that rank's shard of the weights.
  virtual int32_t tensor_parallel_size() const { return 1; }
  virtual int32_t tensor_parallel_rank() const { return 0; }
  // x <- the sum of x over every rank of the group, in place. Every rank calls it with the same shape
  // in the same order (the ranks run one plan). x: [n, dim]. The default throws: no group.
  virtual void all_reduce(Tensor& x);
  // whole <- every rank's part, stacked by rank: rows [r * part.dim(0), (r + 1) * part.dim(0)) of
  // whole are rank r's part. Every rank calls it with the same shape in the same order. part:
  // [rows, dim]; whole: [size * rows, dim], of part's type. The default throws: no group.
  virtual void all_gather(const Tensor& part, Tensor& whole);
  // all_reduce(x), then add_rms_norm(x, residual, w, eps): what a decoder layer does after each
  // row-split projection. A backend may fuse the two (the default calls them in turn).
  virtual void all_reduce_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
    all_reduce(x);
    add_rms_norm(x, residual, w, eps);
  }
  // Ends the group's collectives, those in flight and those to come, so that the other ranks fail
  // instead of waiting for a rank that will never arrive: what a rank that failed mid-step calls.
  virtual void abort_collectives() {}

  // --- sampling ---
  // True when sample() runs where the logits are, so that only the sampled ids (and requested
  // logprobs) come back each step; otherwise the engine downloads the logits and samples on the host.
  virtual bool samples_on_device() const { return false; }
  // One token per row of logits [rows.size(), vocab]. Only where samples_on_device().
  virtual std::vector<SampleOutcome> sample(const Tensor& logits, std::span<const SampleSpec> rows);

 protected:
  // all_gather's contract, for the backends that implement it: throws naming this backend unless part
  // is [rows, dim] and whole [ranks * rows, dim] of part's type.
  void check_all_gather(const Tensor& part, const Tensor& whole, int32_t ranks) const;
};

}  // namespace tessera
