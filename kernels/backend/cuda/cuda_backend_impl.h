// kernels/backend/cuda/cuda_backend_impl.h: CudaBackend::Impl, the state the backend's files share,
// and the helpers they all use. Private to kernels/backend/cuda: each member is defined in the file
// of its concern:
//   cuda_backend.cpp         construction, errors, what the backend reports
//   cuda_memory.cpp          the device allocations and the step workspace (a bump arena)
//   cuda_weights.cpp         weight upload and quantization
//   cuda_step.cpp            per-step state and CUDA-graph capture
//   cuda_attention_plan.cpp  a step's device-side attention metadata, built from its AttentionPlan
//   cuda_ops.cpp             the ops: checks at the boundary, then the kernels
//   cuda_sampling.cpp        sampling on the device
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention_generic/attention_generic.h"
#include "kernels/cuda/collectives/oneshot_allreduce.h"
#include "kernels/cuda/common/dtype.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/quantized_weights.h"

struct ncclComm;  // nccl.h's communicator, which only cuda_collectives.cpp needs in full

namespace tessera {

namespace kc = kernels::cuda;

namespace cuda_backend_detail {

inline constexpr size_t kAlign = 256;  // every step-workspace and staging slice starts on this boundary

inline size_t round_up(size_t n, size_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// The kernels' name of an activation dtype (bf16 or f16); throws for any other.
kc::DType kernel_dtype(ScalarType type);

// The kernels' name of a GPU weight-only format; throws for any other type.
kc::WeightFormat weight_format_of(ScalarType type);

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

inline void check_device(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.defined(), "cuda " << op << ": an operand is undefined");
  TESSERA_CHECK(t.device() == DeviceKind::kCuda, "cuda " << op << ": " << t.describe() << " is not in device memory");
}

// A 2-D tensor of `type` with `cols` columns.
inline void check_matrix(const Tensor& t, const char* op, int64_t cols, ScalarType type) {
  check_device(t, op);
  TESSERA_CHECK(t.type() == type, "cuda " << op << ": " << t.describe() << " must be " << scalar_type_name(type));
  TESSERA_CHECK(t.shape().size() == 2 && t.dim(1) == cols,
                "cuda " << op << ": " << t.describe() << " must be [rows, " << cols << "]");
}

inline int as_int(int64_t v, const char* what) {
  TESSERA_CHECK(v >= 0 && v <= INT32_MAX, "cuda: " << what << " " << v << " does not fit the kernels' int range");
  return static_cast<int>(v);
}

// This step's plan arrays on the device (pointers into the staging buffer: cuda_attention_plan.h),
// and what the layers of the step share: the gathered K/V of a prefill step is gathered once per
// layer into one slice.
struct StepState {
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* kv_lens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* slot_mapping = nullptr;
  const int32_t* last_rows = nullptr;
  const kernels::MaskParams* masks = nullptr;
  std::vector<int32_t> host_last_rows;
  int32_t max_q_len = 0;
  int32_t max_kv_len = 0;
  int32_t total_k = 0;
  int32_t table_width = 0;  // block_tables row stride on the device (padded)
  // A paged step's leading sequences with one query each. In a mixed step they go to the decode
  // kernel, and only the rest (prompt chunks) is gathered for the prefill kernel; cu_seqlens_k_tail
  // and tail_total_k count the keys of that rest alone.
  int32_t decode_rows = 0;
  const int32_t* cu_seqlens_k_tail = nullptr;
  int32_t tail_total_k = 0;
  int32_t decode_context = 0;   // the context the decode kernel plans its split for
  bool graph_eligible = false;  // graphs on, and decode-only and paged or one sequence with no cache
  int32_t encoder_tokens = 0;   // the sequence's length when the plan is one sequence with no cache
  int32_t step_keys = 1;        // AttentionPlan::step_keys_read, at least 1 (DecodeArgs::step_keys)
  bool one_request = false;     // AttentionPlan::one_request
  void* gathered_k = nullptr;
  void* gathered_v = nullptr;
  // linear_silu_mul's GEMM output above kGemvMaxM rows, shared by the step's layers like gathered_k.
  void* gate_up_product = nullptr;
  size_t gate_up_product_bytes = 0;
  // The W8A8 GEMMs' int8 or e4m3 activations and their row scales, shared by the step's linears
  // likewise.
  void* quantized_activations = nullptr;
  size_t quantized_activations_bytes = 0;
};

// Whether a step's decode rows must give the bits each gets alone: on a batch-invariant backend, in
// a step of one request's rows (AttentionPlan::one_request; outside a step, always). Rows of several
// requests are not held to that, as two batches without speculation are not, and take the faster
// kernels.
inline bool invariant_rows(const CudaBackendConfig& config, const StepState* step) {
  return config.batch_invariant_decode && (step == nullptr || step->one_request);
}

// The GEMV setting of a step (gemv.h; Impl::use_row_bits applies it). Invariant rows run every GEMV
// on the row-streaming kernel, and so does a step with a prompt chunk: its rows are then the bits
// they get at any chunk length and on a server that speculates or not (a prefix-cache hit
// recomputes a prompt's last few tokens as a chunk of 8 rows or fewer). Only decode-only steps of
// 2-8 rows take the tensor-core kernel, and only when their rows need not be invariant.
inline kc::GemvRowBits gemv_row_bits(const CudaBackendConfig& config, const StepState* step) {
  const bool prompt_chunk = step != nullptr && step->max_q_len > 1;
  return invariant_rows(config, step) || prompt_chunk ? kc::GemvRowBits::kSameAtAnyM : kc::GemvRowBits::kFastest;
}

}  // namespace cuda_backend_detail

struct CudaBackend::Impl {
  using StepState = cuda_backend_detail::StepState;

  CudaBackendConfig config;
  kc::DType kdtype = kc::DType::kBF16;
  // The KV cache's element type: config.dtype, or e4m3 (kv_kdtype kFp8E4M3).
  ScalarType kv_type = ScalarType::kBF16;
  kc::KvDType kv_kdtype = kc::KvDType::kActivation;
  cudaStream_t stream = nullptr;
  Tensor kv_copy_indices;  // i32 [3, rows] for copy_kv_rows, grown on demand
  int num_sms = 0;
  kc::GemmRunner gemm_runner;
  std::string description;

  bool failed = false;
  std::string failure;

  // The tensor-parallel group's communicator (CudaBackend::form_group); null outside a group and
  // after abort_collectives. Another rank's thread may abort while this one is blocked inside an
  // all-reduce (NCCL's enqueue waits when the peer never drains it): no lock is held across the call,
  // and ncclCommAbort releases the blocked call, as PyTorch's watchdog relies on.
  std::atomic<ncclComm*> nccl{nullptr};
  int32_t group_size = 1;
  int32_t group_rank = 0;
  // The group's peer-to-peer exchange for the one-shot all-reduce (shared by its ranks); null when
  // some pair of its GPUs cannot reach each other's memory.
  std::shared_ptr<kc::OneShotGroup> oneshot;
  std::atomic<bool> collectives_aborted{false};
  // Destroys (or, after an abort, frees) the communicator: cuda_collectives.cpp.
  void leave_group();

  // Step workspace: a bump allocator reset by prepare_plan. When a step outgrows it, more chunks
  // are added for that step, and the next reset folds them into one.
  struct Chunk {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::vector<Chunk> workspace_chunks;
  size_t workspace_used = 0;  // bytes handed out of the last chunk
  bool in_step = false;
  std::shared_ptr<StepState> current_step;  // the plan of the step being run
  // The GEMV setting of the step being run (gemv_row_bits above), for the quantized GEMVs and, through
  // gemm_runner, the dense ones: set once a step by use_row_bits.
  kc::GemvRowBits step_row_bits = kc::GemvRowBits::kFastest;
  void use_row_bits(kc::GemvRowBits row_bits) {
    step_row_bits = row_bits;
    gemm_runner.set_gemv_row_bits(row_bits);
  }

  // Step graphs, by (owner, batch size, table width, step keys: more than 1 in a verify, and for an
  // encoder's forward its sequence's length), the owner being what the step computes with
  // (Backend::run_step). A graph holds the addresses of everything its step touched, so all of them
  // are dropped when any of those may have moved: the step workspace, the staging buffer or the
  // decode workspace grew (layout_generation), or a device allocation such as a KV cache or a model's
  // weights was freed (device_frees).
  struct GraphKey {
    uintptr_t owner;
    int32_t batch;
    int32_t table_width;
    int32_t step_keys;
    bool invariant_rows;
    int32_t encoder_tokens;  // 0 for a decode step
    auto operator<=>(const GraphKey&) const = default;
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    Tensor output;
  };
  static constexpr size_t kMaxGraphs = 512;
  std::map<GraphKey, Graph> graphs;
  std::set<GraphKey> warmed;  // shapes whose first step ran eagerly
  int64_t layout_generation = 0;
  std::shared_ptr<std::atomic<int64_t>> device_frees = std::make_shared<std::atomic<int64_t>>(0);
  int64_t graphs_generation = 0;  // layout_generation + device_frees when the graphs were made
  bool capturing = false;
  int64_t replays = 0;
  int64_t captured = 0;
  int64_t regrowths = 0;  // graphs dropped because a buffer they point into moved

  // Per-step staging of the plan: pinned host memory and its device twin, one copy per step.
  void* staging_host = nullptr;
  void* staging_device = nullptr;
  size_t staging_bytes = 0;
  cudaEvent_t staging_copied = nullptr;  // the last staging copy has read the host buffer

  // The Hopper prefill's work counters (kc::PrefillArgs::tile_counters), 0 between calls.
  int* prefill_tile_counters = nullptr;

  // One allocation: the decode's merge counters, then its split partials (decode_workspace).
  void* decode_workspace_memory = nullptr;
  kc::DecodeWorkspace decode_workspace;

  // Sampling: the kernel's scratch, and one pinned in/out buffer with its device twin (row params,
  // penalty lists going up; sampled rows coming back).
  void* sampling_workspace = nullptr;
  size_t sampling_workspace_bytes = 0;
  void* sample_host = nullptr;
  void* sample_device = nullptr;
  size_t sample_bytes = 0;

  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t quantized_weights = 0;  // linear weights kept in config.linear_weights

  // A quantized linear weight's matrix in the activation dtype: at load, where it is uploaded before
  // quantize_weight, and freed after each (a 7B model's gate_up in bf16 is 180 MB), since steps run
  // on kernels that read the quantized weight. It comes back only for a shape none of them takes
  // (Impl::gemm), at that shape's first call, sized to it and reused by every such linear in turn.
  void* dense_weight = nullptr;
  size_t dense_weight_bytes = 0;
  int64_t quantized_gemms = 0;    // linears above kGemvMaxM rows on a kernel reading the quantized weight
  int64_t dequantized_gemms = 0;  // linears above kGemvMaxM rows on a weight expanded to bf16

  // ---- errors (cuda_backend.cpp)

  // Throws for a failed call, naming the op; a sticky error also marks the backend failed.
  void check(cudaError_t e, const std::string& what);
  // The hot path: the message is built only on failure.
  void check(cudaError_t e, const char* op, const Tensor& on) {
    if (e != cudaSuccess) check(e, std::string(op) + " on " + on.describe());
  }
  void check_healthy() const {
    TESSERA_CHECK(!failed, "cuda backend failed earlier (" << failure << "); restart the server");
    TESSERA_CHECK(!collectives_aborted, "cuda backend: " << kGroupAborted << "; restart the server");
  }
  static constexpr const char* kGroupAborted = "a rank of the tensor-parallel group failed, so the group was aborted";
  // check_healthy, then makes this backend's GPU the calling thread's: the entry points of a step
  // and of loading call it, so that one thread may drive the backends of several GPUs (the ranks of
  // a tensor-parallel group) and any thread may drive any of them. The ops in between follow the
  // step's entry on the same thread.
  void enter() {
    check_healthy();
    check(cudaSetDevice(config.device), "set device");
  }
  void check_supported(const std::string& reason, const char* op) const {
    TESSERA_CHECK(reason.empty(), "cuda " << op << ": unsupported: " << reason);
  }
  // A KV cache tensor of this backend's KV type (a cache made by another backend, or before a
  // change of type, would be read as the wrong element size).
  void check_kv_tensor(const Tensor& t, const char* op) const {
    TESSERA_CHECK(t.type() == kv_type, "cuda " << op << ": KV cache " << t.describe() << " is not "
                                               << scalar_type_name(kv_type) << ", this backend's KV type");
  }

  // ---- memory (cuda_memory.cpp)

  // cudaMalloc of at least one byte; throws naming `name` and the free memory when it fails.
  void* device_alloc(size_t bytes, const std::string& name);
  // A slice of the step workspace, grown (by a new chunk) when the step outgrows it.
  void* workspace_slice(size_t bytes);
  // Folds the chunks a step added into one, and hands the workspace out from its start again.
  void reset_workspace();
  // A persistent tensor owns its allocation (zeroed); any other is a slice of the step workspace.
  Tensor allocate_tensor(std::vector<int64_t> shape, ScalarType type, std::string name, bool persistent);
  // A buffer of the current step shared by its layers (the stream orders their uses; grown when a
  // layer needs more), or a slice of the workspace outside a step.
  void* step_shared_buffer(void* StepState::*ptr, size_t StepState::*have, size_t bytes);
  // Waits until the last step's plan copy has read the pinned staging buffer, then makes it and its
  // device twin hold at least `bytes`.
  void reserve_staging(size_t bytes);
  // The split-KV scratch for a decode call of this shape, grown (rarely) when it needs more.
  const kc::DecodeWorkspace& decode_workspace_for(const kc::DecodeArgs& args);

  // ---- weights (cuda_weights.cpp)

  // The dense buffer for loading a weight of `bytes`. Load time only: a step may still be reading
  // the buffer, so this waits for the stream.
  void* dense_weight_buffer(size_t bytes, const std::string& name);
  void release_dense_weight();
  // The weight about to be uploaded as [rows, cols]: true when it is kept quantized. Throws naming
  // the tensor when the format cannot hold its shape.
  bool keeps_quantized(WeightUse use, const std::vector<int64_t>& shape, const std::string& name) const;
  // `dense` (the activation dtype, [shape]) quantized into a new weight tensor of config.linear_weights.
  Tensor quantize_dense(const void* dense, std::vector<int64_t> shape, std::string name);
  // Copies a stored weight into `dst` ([numel] of the backend dtype): bytes as they are when the file
  // already holds that dtype, otherwise through fp32 (dequantizing GGUF blocks).
  void upload_weight(const WeightView& weight, void* dst);
  // A gate and an up matrix of one shape into `dst` ([shape], the stacked shape) in pairs order: row
  // 2j is gate row j, row 2j + 1 up row j.
  void upload_pairs(const WeightView& gate, const WeightView& up, const std::vector<int64_t>& shape, void* dst,
                    const std::string& name);

  // ---- per-step state and graphs (cuda_step.cpp)

  // The step state prepare_plan attached to `plan`; throws naming `op` when it has none.
  StepState& step_state(const AttentionPlan& plan, const char* op) {
    TESSERA_CHECK(plan.backend_state != nullptr, "cuda " << op << ": the plan was not prepared (prepare_plan)");
    return *static_cast<StepState*>(plan.backend_state.get());
  }
  // A buffer that captured graphs point into was reallocated: they must all be captured again.
  void layout_moved();
  void drop_graphs();

  // ---- sampling (cuda_sampling.cpp)

  // The pinned sampling buffer and its device twin, holding at least `bytes`.
  void reserve_sample_buffers(size_t bytes);
  // The sampling kernel's scratch, holding at least `bytes`.
  void reserve_sampling_workspace(size_t bytes);
  // Sets each row's masked_tokens logits to a value sampling gives probability 0.
  void mask_tokens(const Tensor& logits, std::span<const SampleSpec> rows, int vocab);

  // ---- ops (cuda_ops.cpp)

  // Throws naming `op` unless the quantized GEMV takes this shape and these pointers' alignment.
  void check_quantized_gemv(kc::WeightFormat format, const Tensor& x, const Tensor& w, int rows, int n, int k,
                            const char* op) const;
  // y[rows, n] <- x · wᵀ (+ bias) for every weight and row count the GEMV kernels leave.
  void gemm(const Tensor& x, const Tensor& w, const void* bias, void* y, int rows, int n, int k, const char* op);
  // gemm() of a quantized weight on a kernel that reads it as stored (W8A8 for int8 and fp8_e4m3,
  // mixed-input for int4_g128); false when none takes the shape.
  bool quantized_gemm(kc::WeightFormat format, const Tensor& x, const Tensor& w, const void* bias, void* y, int rows,
                      int n, int k, const char* op);

  // The pieces of CudaBackend::attend. `prefill` and `generic` come filled but for where the keys
  // are; k and v point into the packed qkv, whose rows are `stride` elements wide.
  //   attend_packed: a step without a KV cache, over its own packed K/V.
  //   append_kv: the step's K/V into `layer`'s paged cache (K rotated on the way when
  //     rope_inv_freq is set: then q, inside qkv, is rotated in place too).
  //   attend_paged: every query against the paged cache (decode kernel, gathered prefill, or the
  //     generic kernel).
  void attend_packed(kc::PrefillArgs prefill, kc::GenericAttentionArgs generic, const void* k, const void* v,
                     int64_t stride, const Tensor& qkv, const StepState& step);
  void append_kv(KvCacheStorage& cache, int64_t layer, const QkvLayout& layout, const Tensor& qkv,
                 const StepState& step, const Tensor* rope_inv_freq);
  void attend_paged(kc::PrefillArgs prefill, kc::GenericAttentionArgs generic, kc::DecodeArgs decode,
                    KvCacheStorage& cache, int64_t layer, const QkvLayout& layout, const Tensor& qkv,
                    StepState& step);
};

}  // namespace tessera
