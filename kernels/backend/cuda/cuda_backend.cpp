// kernels/backend/cuda/cuda_backend.cpp: CudaBackend. Checks shapes and dtypes at the boundary,
// then enqueues kernels/cuda on the backend's stream.
#include "kernels/backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "kernels/cuda/activation/activation.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention_generic/attention_generic.h"
#include "kernels/cuda/common/host_convert.h"
#include "kernels/cuda/embedding/embedding.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/quantized_weights.h"
#include "kernels/cuda/kv_cache/kv_cache.h"
#include "kernels/cuda/norm/norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/rows/rows.h"
#include "kernels/cuda/sampling/sampling.h"

namespace tessera {

namespace kc = kernels::cuda;

namespace {

constexpr size_t kAlign = 256;  // every step-workspace and staging slice starts on this boundary

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Errors after which the CUDA context is unusable: every later call fails with the same error.
bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
      return true;
    default:
      return false;
  }
}

kc::DType kernel_dtype(ScalarType t) {
  TESSERA_CHECK(t == ScalarType::kBF16 || t == ScalarType::kF16,
                "cuda backend: dtype " << scalar_type_name(t) << " is not an activation dtype (bf16 or f16)");
  return t == ScalarType::kBF16 ? kc::DType::kBF16 : kc::DType::kFP16;
}

// The kernels' name of a GPU weight-only format.
kc::WeightFormat weight_format_of(ScalarType t) {
  switch (t) {
    case ScalarType::kInt8PerRow: return kc::WeightFormat::kInt8;
    case ScalarType::kInt4G128: return kc::WeightFormat::kInt4G128;
    case ScalarType::kFp8E4M3PerRow: return kc::WeightFormat::kFp8E4M3;
    default: break;
  }
  TESSERA_FAIL("cuda backend: " << scalar_type_name(t) << " is not a GPU weight-only format");
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// This step's plan arrays on the device (pointers into the staging buffer), and what the layers of
// the step share: the gathered K/V of a prefill step is gathered once per layer into one slice.
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
  int32_t table_width = 0;        // block_tables row stride on the device (padded)
  // A paged step's leading sequences with one query each. In a mixed step they go to the decode
  // kernel, and only the rest (prompt chunks) is gathered for the prefill kernel; cu_seqlens_k_tail
  // and tail_total_k count the keys of that rest alone.
  int32_t decode_rows = 0;
  const int32_t* cu_seqlens_k_tail = nullptr;
  int32_t tail_total_k = 0;
  int32_t decode_context = 0;     // the context the decode kernel plans its split for
  bool graph_eligible = false;    // decode-only, paged, graphs on
  void* gathered_k = nullptr;
  void* gathered_v = nullptr;
  // linear_silu_mul's GEMM output above kGemvMaxM rows, shared by the step's layers like gathered_k.
  void* gate_up_product = nullptr;
  size_t gate_up_product_bytes = 0;
  // The W8A8 GEMMs' e4m3 activations and their row scales, shared by the step's linears likewise.
  void* fp8_activations = nullptr;
  size_t fp8_activations_bytes = 0;
};

}  // namespace

void CudaBackendConfig::validate() const {
  TESSERA_CHECK(device >= 0, "cuda backend: device must be >= 0, got " << device);
  TESSERA_CHECK(dtype == ScalarType::kBF16 || dtype == ScalarType::kF16,
                "cuda backend: dtype must be bf16 or f16, got " << scalar_type_name(dtype));
  TESSERA_CHECK(linear_weights == dtype || scalar_type_is_gpu_quantized(linear_weights),
                "cuda backend: linear_weights must be the dtype (" << scalar_type_name(dtype)
                    << ": unquantized), int8, int4_g128 or fp8_e4m3, got " << scalar_type_name(linear_weights));
  TESSERA_CHECK(!scalar_type_is_gpu_quantized(linear_weights) || dtype == ScalarType::kBF16,
                "cuda backend: linear_weights " << scalar_type_name(linear_weights)
                    << " needs dtype bf16 (the quantized kernels take bf16 activations), got dtype "
                    << scalar_type_name(dtype));
  TESSERA_CHECK(decode_split_min_tokens == 0 || (decode_split_min_tokens >= 32 && decode_split_min_tokens <= 1024 &&
                                                 decode_split_min_tokens % 32 == 0),
                "cuda backend: decode_split_min_tokens must be 0 (the kernel's default) or a multiple of 32 in "
                "[32, 1024], got "
                    << decode_split_min_tokens);
  if (kv_cache_dtype.has_value()) {
    TESSERA_CHECK(*kv_cache_dtype == dtype || *kv_cache_dtype == ScalarType::kFp8E4M3,
                  "cuda backend: kv_cache_dtype must be the dtype (" << scalar_type_name(dtype)
                      << ") or e4m3 (fp8_e4m3), got " << scalar_type_name(*kv_cache_dtype));
    TESSERA_CHECK(*kv_cache_dtype != ScalarType::kFp8E4M3 || dtype == ScalarType::kBF16,
                  "cuda backend: kv_cache_dtype fp8_e4m3 needs dtype bf16 (the fp8 KV kernels take bf16 "
                  "activations), got dtype "
                      << scalar_type_name(dtype));
  }
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for the caller
    return 0;
  }
  return count;
}

std::string cuda_device_description(int device) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  TESSERA_CHECK(e == cudaSuccess, "cuda device " << device << ": " << cudaGetErrorString(e));
  std::ostringstream os;
  os << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount << " SMs, "
     << static_cast<double>(prop.totalGlobalMem) / (1u << 30) << " GiB)";
  return os.str();
}

struct CudaBackend::Impl {
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

  // Step workspace: a bump allocator reset by prepare_plan. When a step outgrows it, more chunks
  // are added for that step, and the next reset folds them into one.
  struct Chunk {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::vector<Chunk> chunks;
  size_t chunk_used = 0;
  bool in_step = false;
  std::shared_ptr<StepState> current_step;  // the plan of the step being run

  // Decode graphs, by (batch size, table width). A graph holds the addresses of everything its step
  // touched, so all of them are dropped when any of those may have moved: the step workspace, the
  // staging buffer or the decode workspace grew (layout_generation), or a device allocation such as
  // a KV cache or a model's weights was freed (freed).
  struct GraphKey {
    int32_t batch;
    int32_t table_width;
    auto operator<=>(const GraphKey&) const = default;
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    Tensor output;
  };
  static constexpr size_t kMaxGraphs = 512;
  std::map<GraphKey, Graph> graphs;
  std::set<GraphKey> warmed;
  int64_t layout_generation = 0;
  std::shared_ptr<std::atomic<int64_t>> freed = std::make_shared<std::atomic<int64_t>>(0);
  int64_t graphs_generation = 0;  // layout_generation + freed when the graphs were made
  bool capturing = false;
  int64_t replays = 0;
  int64_t captured = 0;
  int64_t regrowths = 0;  // graphs dropped because a buffer they point into moved

  // Per-step staging of the plan: pinned host memory and its device twin, one copy per step.
  void* staging_host = nullptr;
  void* staging_device = nullptr;
  size_t staging_bytes = 0;
  cudaEvent_t staged = nullptr;  // the last staging copy has read the host buffer

  // One allocation: the decode's merge counters, then its split partials (kc::DecodeWorkspace).
  void* decode_workspace = nullptr;
  kc::DecodeWorkspace decode_split;

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
  // quantize_weight; in a step, where dequantize_weight expands int8 and int4_g128 weights for a
  // cuBLASLt GEMM (more rows than the GEMV kernels take). For those it is persistent, sized at load
  // to the largest quantized weight and reused by every linear in turn (the stream orders the uses),
  // so a step allocates nothing for it and a captured graph's address of it stays valid. fp8_e4m3
  // weights run as W8A8 instead and free it after each load (a 7B model's gate_up in bf16 is 180 MB);
  // it comes back only for a shape cuBLASLt's FP8 kernels refuse, at that shape's first call.
  void* dense_weight = nullptr;
  size_t dense_weight_bytes = 0;
  int64_t fp8_w8a8_gemms = 0;     // linears above kGemvMaxM rows on the FP8 tensor cores
  int64_t dequantized_gemms = 0;  // linears above kGemvMaxM rows on a weight expanded to bf16

  // Throws for a failed call, naming the op; a sticky error also marks the backend failed.
  void check(cudaError_t e, const std::string& what) {
    if (e == cudaSuccess) return;
    if (is_sticky(e)) {
      failed = true;
      failure = what + ": " + cudaGetErrorString(e);
      TESSERA_FAIL("cuda backend failed (sticky CUDA error, restart required): " << failure);
    }
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    TESSERA_FAIL("cuda " << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")");
  }
  // The hot path: the message is built only on failure.
  void check(cudaError_t e, const char* op, const Tensor& on) {
    if (e != cudaSuccess) check(e, std::string(op) + " on " + on.describe());
  }
  void check_healthy() const {
    TESSERA_CHECK(!failed, "cuda backend failed earlier (" << failure << "); restart the server");
  }
  void check_supported(const std::string& reason, const char* op) const {
    TESSERA_CHECK(reason.empty(), "cuda " << op << ": unsupported: " << reason);
  }

  void* device_alloc(size_t bytes, const std::string& name) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      TESSERA_FAIL("cuda: out of device memory allocating " << bytes << " bytes for " << name << " (" << free_b
                                                             << " of " << total_b << " bytes free)");
    }
    return p;
  }

  // The dense buffer for loading a weight of `bytes`. Load time only: a step may still be reading
  // the buffer, so this waits for the stream.
  void* dense_weight_buffer(size_t bytes, const std::string& name) {
    check(cudaStreamSynchronize(stream), "dense weight buffer for " + name);
    if (bytes > dense_weight_bytes) {
      TESSERA_CHECK(!capturing, "cuda: the dense weight buffer must grow during a graph capture");
      if (dense_weight != nullptr) {
        cudaFree(dense_weight);
        layout_moved();  // captured graphs may point into the old buffer
      }
      dense_weight = nullptr;
      dense_weight_bytes = 0;
      dense_weight = device_alloc(bytes, "the dense copy of " + name);
      dense_weight_bytes = bytes;
    }
    return dense_weight;
  }

  // The weight about to be uploaded as [rows, cols]: true when it is kept quantized. Throws naming
  // the tensor when the format cannot hold its shape.
  bool quantizes(WeightUse use, const std::vector<int64_t>& shape, const std::string& name) const {
    if (use == WeightUse::kOther || !scalar_type_is_gpu_quantized(config.linear_weights)) return false;
    TESSERA_CHECK(shape.size() == 2, "cuda: linear weight " << name << " " << shape_string(shape) << " is not a matrix");
    std::string why;
    TESSERA_CHECK(storage_holds(config.linear_weights, shape[0], shape[1], &why),
                  "cuda: linear weight " << name << " cannot be kept as " << scalar_type_name(config.linear_weights)
                                         << ": " << why << " (cuda_weights: native keeps it in "
                                         << scalar_type_name(config.dtype) << ")");
    TESSERA_CHECK(shape[0] <= INT32_MAX && shape[1] <= INT32_MAX && shape[0] * shape[1] <= INT32_MAX,
                  "cuda: linear weight " << name << " " << shape_string(shape) << " is too large for the quantized kernels");
    return true;
  }

  // `dense` (the activation dtype, [shape]) quantized into a new weight tensor of config.linear_weights.
  Tensor quantize(const void* dense, std::vector<int64_t> shape, std::string name) {
    const int n = static_cast<int>(shape[0]);
    const int k = static_cast<int>(shape[1]);
    Tensor q = make(std::move(shape), config.linear_weights, std::move(name), /*persistent=*/true);
    const kc::WeightFormat format = weight_format_of(config.linear_weights);
    check(kc::quantize_weight(kdtype, dense, n, k, format, q.data(), stream), "quantize_weight", q);
    // The next upload rewrites `dense` with a copy that need not be ordered on this stream.
    check(cudaStreamSynchronize(stream), "quantize " + q.name());
    if (format == kc::WeightFormat::kFp8E4M3) release_dense_weight();  // W8A8 steps do not read it
    ++quantized_weights;
    return q;
  }

  void release_dense_weight() {
    if (dense_weight == nullptr) return;
    TESSERA_CHECK(!capturing, "cuda: the dense weight buffer must be freed during a graph capture");
    check(cudaStreamSynchronize(stream), "release the dense weight buffer");
    cudaFree(dense_weight);
    layout_moved();  // a graph captured on a fallback GEMM points into it
    dense_weight = nullptr;
    dense_weight_bytes = 0;
  }

  // A buffer of the current step shared by its layers (the stream orders their uses; grown when a
  // layer needs more), or a slice of the workspace outside a step.
  void* step_shared(void* StepState::*ptr, size_t StepState::*have, size_t bytes) {
    if (current_step == nullptr || !in_step) return scratch(bytes);
    StepState& st = *current_step;
    if (st.*have < bytes) {
      st.*ptr = scratch(bytes);
      st.*have = bytes;
    }
    return st.*ptr;
  }

  // y[rows, n] <- x · wᵀ (+ bias) for every weight and row count the GEMV kernels leave: the one
  // place that picks the GEMM. Dense weights: cuBLASLt in the activation dtype. fp8_e4m3 weights:
  // W8A8, the rows quantized to e4m3 and multiplied on the FP8 tensor cores (twice bf16's rate, and
  // no bf16 copy of the weight), unless cuBLASLt has no FP8 kernel for the shape. Other quantized
  // weights: expanded to bf16 into the dense buffer, then cuBLASLt.
  void gemm(const Tensor& x, const Tensor& w, const void* bias, void* y, int rows, int n, int k, const char* op) {
    const void* weight = w.data();
    if (scalar_type_is_gpu_quantized(w.type())) {
      const kc::WeightFormat format = weight_format_of(w.type());
      if (format == kc::WeightFormat::kFp8E4M3) {
        const size_t bytes = kc::quantized_weight_bytes(format, rows, k);
        void* xq = step_shared(&StepState::fp8_activations, &StepState::fp8_activations_bytes, bytes);
        check(kc::quantize_activations_fp8(kdtype, x.data(), rows, k, xq, stream), "quantize_activations_fp8", x);
        const cudaError_t e = gemm_runner.run_fp8_rowwise(y, xq, kc::quantized_row_scales(format, xq, rows, k), w.data(),
                                                          kc::quantized_row_scales(format, w.data(), n, k), bias, rows,
                                                          n, k, stream);
        if (e == cudaSuccess) {
          ++fp8_w8a8_gemms;
          return;
        }
        if (e != cudaErrorNotSupported) check(e, std::string(op) + " " + w.describe() + " (" + gemm_runner.last_error() + ")");
        // No FP8 kernel for this shape: the weight expanded to bf16, as for the other formats.
        if (static_cast<size_t>(w.numel()) * 2 > dense_weight_bytes)
          dense_weight_buffer(static_cast<size_t>(w.numel()) * 2, w.name());
      }
      TESSERA_CHECK(static_cast<size_t>(w.numel()) * 2 <= dense_weight_bytes,
                    "cuda " << op << ": quantized weight " << w.describe() << " was not loaded by this backend");
      check(kc::dequantize_weight(kdtype, w.data(), n, k, format, dense_weight, stream), "dequantize_weight", w);
      weight = dense_weight;
      ++dequantized_gemms;
    }
    const cudaError_t e = gemm_runner.run(kdtype, y, x.data(), weight, bias, rows, n, k, stream);
    if (e != cudaSuccess) check(e, std::string(op) + " " + w.describe() + " (" + gemm_runner.last_error() + ")");
  }

  void* scratch(size_t bytes) {
    bytes = round_up(std::max<size_t>(bytes, 1), kAlign);
    if (chunks.empty() || chunk_used + bytes > chunks.back().bytes) {
      TESSERA_CHECK(!capturing, "cuda: the step workspace must grow during a graph capture");
      const size_t grow = std::max(bytes, chunks.empty() ? size_t{64} << 20 : chunks.back().bytes);
      chunks.push_back({device_alloc(grow, "the step workspace"), grow});
      chunk_used = 0;
    }
    void* p = static_cast<char*>(chunks.back().ptr) + chunk_used;
    chunk_used += bytes;
    return p;
  }

  void reset_scratch() {
    if (chunks.size() > 1) {
      size_t total = 0;
      for (const Chunk& c : chunks) total += c.bytes;
      check(cudaStreamSynchronize(stream), "step workspace resize");
      for (const Chunk& c : chunks) cudaFree(c.ptr);
      chunks.clear();
      chunks.push_back({device_alloc(total, "the step workspace"), total});
      layout_moved();
    }
    chunk_used = 0;
  }

  Tensor make(std::vector<int64_t> shape, ScalarType type, std::string name, bool persistent) {
    for (int64_t d : shape) {
      TESSERA_CHECK(d >= 0, "cuda empty: tensor " << name << " has a negative dimension " << shape_string(shape));
    }
    const int64_t cols = shape.empty() ? 1 : shape.back();
    const size_t bytes = static_cast<size_t>(storage_bytes(type, cols == 0 ? 0 : numel_of(shape) / cols, cols));
    if (!persistent) {
      void* p = scratch(bytes);
      return Tensor(nullptr, p, type, std::move(shape), DeviceKind::kCuda, std::move(name));
    }
    void* p = device_alloc(bytes, name);
    check(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 1), stream), "memset " + name);
    std::shared_ptr<void> storage(p, [freed = freed](void* q) {
      cudaFree(q);
      freed->fetch_add(1);
    });
    return Tensor(std::move(storage), p, type, std::move(shape), DeviceKind::kCuda, std::move(name));
  }

  // Copies a stored weight into `dst` ([numel] of the backend dtype): bytes as they are when the file
  // already holds that dtype, otherwise through fp32 (dequantizing GGUF blocks).
  void upload_weight(const WeightView& w, void* dst) {
    const bool same = (w.dtype == DType::kBF16 && config.dtype == ScalarType::kBF16) ||
                      (w.dtype == DType::kF16 && config.dtype == ScalarType::kF16);
    if (same) {
      TESSERA_CHECK(w.bytes.size() == static_cast<size_t>(w.numel()) * 2,
                    "tensor '" << w.name << "' in " << w.source_file << ": " << w.bytes.size()
                               << " bytes do not hold " << w.numel() << " values");
      check(cudaMemcpyAsync(dst, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice, stream), "upload " + w.name);
      check(cudaStreamSynchronize(stream), "upload " + w.name);
      return;
    }
    const std::vector<float> values = w.to_f32();
    std::vector<uint16_t> half(values.size());
    for (size_t i = 0; i < values.size(); ++i) half[i] = kc::to_bits(values[i], kdtype);
    check(cudaMemcpy(dst, half.data(), half.size() * 2, cudaMemcpyHostToDevice), "upload " + w.name);
  }

  StepState& step(const AttentionPlan& plan, const char* op) {
    TESSERA_CHECK(plan.backend_state != nullptr, "cuda " << op << ": the plan was not prepared (prepare_plan)");
    return *static_cast<StepState*>(plan.backend_state.get());
  }

  // A buffer that captured graphs point into was reallocated: they must all be captured again.
  void layout_moved() {
    if (!graphs.empty()) ++regrowths;
    ++layout_generation;
  }

  void drop_graphs() {
    for (auto& [key, graph] : graphs) cudaGraphExecDestroy(graph.exec);
    graphs.clear();
    warmed.clear();
  }

  // A KV cache tensor of this backend's KV type (a cache made by another backend, or before a
  // change of type, would be read as the wrong element size).
  void check_kv_tensor(const Tensor& t, const char* op) const {
    TESSERA_CHECK(t.type() == kv_type, "cuda " << op << ": KV cache " << t.describe() << " is not "
                                                << scalar_type_name(kv_type) << ", this backend's KV type");
  }

  const kc::DecodeWorkspace& decode_scratch(const kc::DecodeArgs& args) {
    const kc::DecodeWorkspaceNeed need = kc::decode_workspace_need(args, num_sms);
    if (need.partial_bytes > decode_split.partial_bytes || need.counters > decode_split.counter_count) {
      // Grown rarely (a larger batch or context than any before); the counters must start at zero.
      TESSERA_CHECK(!capturing, "cuda: the decode workspace must grow during a graph capture");
      check(cudaStreamSynchronize(stream), "decode workspace resize");
      layout_moved();
      if (decode_workspace != nullptr) cudaFree(decode_workspace);
      const int64_t counters = std::max<int64_t>(2 * need.counters, decode_split.counter_count);
      const size_t counter_bytes = round_up(static_cast<size_t>(counters) * sizeof(int), kAlign);
      const size_t partial_bytes = round_up(std::max(2 * need.partial_bytes, decode_split.partial_bytes), kAlign);
      decode_workspace = device_alloc(counter_bytes + partial_bytes, "the decode workspace");
      check(cudaMemsetAsync(decode_workspace, 0, counter_bytes + partial_bytes, stream), "decode workspace");
      decode_split.counters = static_cast<int*>(decode_workspace);
      decode_split.counter_count = counters;
      decode_split.partials = static_cast<char*>(decode_workspace) + counter_bytes;
      decode_split.partial_bytes = partial_bytes;
    }
    return decode_split;
  }
};

CudaBackend::CudaBackend(CudaBackendConfig config) : impl_(std::make_unique<Impl>()) {
  config.validate();
  const int count = cuda_device_count();
  TESSERA_CHECK(count > 0, "backend cuda: no CUDA GPU is visible (check the driver, CUDA_VISIBLE_DEVICES, or use "
                           "backend cpu)");
  TESSERA_CHECK(config.device < count,
                "backend cuda: device " << config.device << " does not exist (" << count << " visible)");
  Impl& m = *impl_;
  m.config = config;
  m.kdtype = kernel_dtype(config.dtype);
  m.kv_type = config.kv_cache_dtype.value_or(config.dtype);
  m.kv_kdtype = m.kv_type == ScalarType::kFp8E4M3 ? kc::KvDType::kFp8E4M3 : kc::KvDType::kActivation;
  m.check(cudaSetDevice(config.device), "set device");
  m.check(cudaDeviceGetAttribute(&m.num_sms, cudaDevAttrMultiProcessorCount, config.device), "device attributes");
  m.check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "stream");
  m.check(cudaEventCreateWithFlags(&m.staged, cudaEventDisableTiming), "event");
  m.check(m.gemm_runner.init(), "cuBLASLt init " + m.gemm_runner.last_error());
  m.description = cuda_device_description(config.device);
}

CudaBackend::~CudaBackend() {
  Impl& m = *impl_;
  if (m.stream != nullptr) cudaStreamSynchronize(m.stream);
  m.drop_graphs();
  for (const Impl::Chunk& c : m.chunks) cudaFree(c.ptr);
  if (m.staging_device != nullptr) cudaFree(m.staging_device);
  if (m.staging_host != nullptr) cudaFreeHost(m.staging_host);
  if (m.decode_workspace != nullptr) cudaFree(m.decode_workspace);
  if (m.dense_weight != nullptr) cudaFree(m.dense_weight);
  if (m.sampling_workspace != nullptr) cudaFree(m.sampling_workspace);
  if (m.sample_device != nullptr) cudaFree(m.sample_device);
  if (m.sample_host != nullptr) cudaFreeHost(m.sample_host);
  if (m.staged != nullptr) cudaEventDestroy(m.staged);
  if (m.stream != nullptr) cudaStreamDestroy(m.stream);
}

ScalarType CudaBackend::activation_type() const { return impl_->config.dtype; }
ScalarType CudaBackend::kv_cache_type() const { return impl_->kv_type; }
std::string CudaBackend::failure() const { return impl_->failure; }
int64_t CudaBackend::graph_replays() const { return impl_->replays; }
int64_t CudaBackend::graphs_captured() const { return impl_->captured; }
std::string CudaBackend::device_description() const { return impl_->description; }
int64_t CudaBackend::weight_bytes() const { return impl_->weight_bytes; }

std::optional<int64_t> CudaBackend::free_device_bytes() const {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return std::nullopt;
  return static_cast<int64_t>(free_b);
}

std::string CudaBackend::describe() const {
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (int64_t{1} << 30); };
  std::ostringstream os;
  os.precision(3);
  os << "cuda: " << impl_->description << ", " << scalar_type_name(activation_type()) << ", linear weights "
     << scalar_type_name(impl_->config.linear_weights);
  if (scalar_type_is_gpu_quantized(impl_->config.linear_weights)) os << " (" << impl_->quantized_weights << " tensors)";
  if (impl_->config.decode_split_min_tokens != 0) os << ", decode splits >= " << impl_->config.decode_split_min_tokens << " tokens";
  os << ", weights " << gib(impl_->weight_bytes) << " GiB, KV cache "
     << (impl_->kv_type == ScalarType::kFp8E4M3 ? "fp8_e4m3" : scalar_type_name(impl_->kv_type)) << " "
     << gib(impl_->kv_bytes) << " GiB, free "
     << gib(free_device_bytes().value_or(0)) << " GiB";
  return os.str();
}

// ---------------------------------------------------------------- memory

Tensor CudaBackend::empty(std::vector<int64_t> shape, ScalarType type, std::string name) {
  impl_->check_healthy();
  return impl_->make(std::move(shape), type, std::move(name), /*persistent=*/!impl_->in_step);
}

Tensor CudaBackend::upload(std::span<const float> host, std::vector<int64_t> shape, std::string name) {
  // Float tables (RoPE frequencies) belong to a model, even one loaded after a step has run.
  impl_->check_healthy();
  Tensor t = impl_->make(std::move(shape), ScalarType::kF32, std::move(name), /*persistent=*/true);
  TESSERA_CHECK(static_cast<int64_t>(host.size()) == t.numel(),
                "cuda upload: " << host.size() << " values for " << t.describe());
  impl_->check(cudaMemcpyAsync(t.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, impl_->stream),
               "upload " + t.name());
  return t;
}

Tensor CudaBackend::upload(std::span<const int32_t> host, std::vector<int64_t> shape, std::string name) {
  Tensor t = empty(std::move(shape), ScalarType::kI32, std::move(name));
  TESSERA_CHECK(static_cast<int64_t>(host.size()) == t.numel(),
                "cuda upload: " << host.size() << " values for " << t.describe());
  impl_->check(cudaMemcpyAsync(t.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, impl_->stream),
               "upload " + t.name());
  return t;
}

std::vector<float> CudaBackend::download(const Tensor& tensor) {
  Impl& m = *impl_;
  m.check_healthy();
  TESSERA_CHECK(tensor.defined() && tensor.device() == DeviceKind::kCuda,
                "cuda download: " << tensor.describe() << " is not a device tensor");
  const size_t n = static_cast<size_t>(tensor.numel());
  std::vector<float> out(n);
  if (tensor.type() == ScalarType::kF32) {
    m.check(cudaMemcpyAsync(out.data(), tensor.data(), n * 4, cudaMemcpyDeviceToHost, m.stream), "download");
    m.check(cudaStreamSynchronize(m.stream), "download " + tensor.name());
    return out;
  }
  TESSERA_CHECK(tensor.type() == ScalarType::kBF16 || tensor.type() == ScalarType::kF16,
                "cuda download: " << tensor.describe() << " is not a float tensor");
  std::vector<uint16_t> half(n);
  m.check(cudaMemcpyAsync(half.data(), tensor.data(), n * 2, cudaMemcpyDeviceToHost, m.stream), "download");
  m.check(cudaStreamSynchronize(m.stream), "download " + tensor.name());
  for (size_t i = 0; i < n; ++i) out[i] = kc::from_bits(half[i], kernel_dtype(tensor.type()));
  return out;
}

// ---------------------------------------------------------------- weights

Tensor CudaBackend::load_weight(const WeightView& weight, std::vector<int64_t> shape, WeightUse use) {
  Impl& m = *impl_;
  m.check_healthy();
  check_weight_shape(weight, shape);
  Tensor t;
  if (m.quantizes(use, shape, weight.name)) {
    // Uploaded into the dense buffer, quantized from there: one weight's bf16 copy at a time.
    void* dense = m.dense_weight_buffer(static_cast<size_t>(weight.numel()) * 2, weight.name);
    m.upload_weight(weight, dense);
    t = m.quantize(dense, std::move(shape), weight.name);
  } else {
    t = m.make(std::move(shape), m.config.dtype, weight.name, /*persistent=*/true);
    m.upload_weight(weight, t.data());
  }
  m.weight_bytes += t.bytes();
  return t;
}

Tensor CudaBackend::load_stacked(std::span<const WeightView* const> parts, std::span<const std::vector<int64_t>> shapes,
                                 std::string fused_name, WeightUse use) {
  Impl& m = *impl_;
  m.check_healthy();
  std::vector<int64_t> shape = stacked_shape(parts, shapes, fused_name);
  // linear_silu_mul's weight in pairs order: row 2j is gate row j, row 2j + 1 up row j, so that the
  // GEMV block computing one holds the other (kernels/cuda/gemm/gemv.h, gemv_silu_mul).
  const bool pairs = use == WeightUse::kGateUpSiluMul;
  if (pairs) {
    TESSERA_CHECK(parts.size() == 2 && shape.size() == 2 && shapes[0] == shapes[1],
                  "cuda: " << fused_name << " for linear_silu_mul must stack two matrices of one shape (gate, up), got "
                           << parts.size() << " parts");
  }
  // The stacked matrix is quantized as one (its rows are independent in every format).
  const bool quantized = m.quantizes(use, shape, fused_name);
  Tensor t;
  void* base = nullptr;
  if (quantized) {
    base = m.dense_weight_buffer(static_cast<size_t>(numel_of(shape)) * 2, fused_name);
  } else {
    t = m.make(shape, m.config.dtype, fused_name, /*persistent=*/true);
    base = t.data();
  }
  if (pairs) {
    // Uploaded stacked into a load-time buffer, then interleaved row by row on the device (one 2-D
    // copy per part: a host-side 2-D copy from pageable memory goes row by row).
    const size_t row_bytes = static_cast<size_t>(shape[1]) * scalar_type_bytes(m.config.dtype);
    const size_t part_bytes = static_cast<size_t>(shape[0] / 2) * row_bytes;
    char* stacked = static_cast<char*>(m.device_alloc(2 * part_bytes, "the stacked copy of " + fused_name));
    m.upload_weight(*parts[0], stacked);
    m.upload_weight(*parts[1], stacked + part_bytes);
    for (int p = 0; p < 2; ++p) {
      m.check(cudaMemcpy2DAsync(static_cast<char*>(base) + p * row_bytes, 2 * row_bytes, stacked + p * part_bytes,
                                row_bytes, row_bytes, static_cast<size_t>(shape[0] / 2), cudaMemcpyDeviceToDevice,
                                m.stream),
              "interleave " + fused_name);
    }
    m.check(cudaStreamSynchronize(m.stream), "interleave " + fused_name);
    cudaFree(stacked);
  } else {
    char* dst = static_cast<char*>(base);
    for (const WeightView* part : parts) {
      m.upload_weight(*part, dst);
      dst += part->numel() * scalar_type_bytes(m.config.dtype);
    }
  }
  if (quantized) t = m.quantize(base, std::move(shape), std::move(fused_name));
  m.weight_bytes += t.bytes();
  return t;
}

// ---------------------------------------------------------------- per-step state

KvCacheStorage CudaBackend::create_kv_cache(int64_t num_layers, int32_t num_blocks, int32_t block_size,
                                            int32_t num_kv_heads, int32_t head_dim) {
  Impl& m = *impl_;
  m.check_healthy();
  KvCacheStorage cache = make_kv_cache("cuda", num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                                       [&](std::vector<int64_t> shape, std::string name) {
                                         Tensor t = m.make(std::move(shape), m.kv_type, std::move(name),
                                                           /*persistent=*/true);
                                         m.kv_bytes += t.bytes();
                                         return t;
                                       });
  m.check(cudaStreamSynchronize(m.stream), "create_kv_cache");
  return cache;
}

void CudaBackend::prepare_plan(AttentionPlan& plan) { prepare_step(plan, {}); }

Tensor CudaBackend::prepare_step(AttentionPlan& plan, std::span<const int32_t> token_ids) {
  Impl& m = *impl_;
  m.check_healthy();
  TESSERA_CHECK(token_ids.empty() || static_cast<int64_t>(token_ids.size()) == plan.total_q(),
                "cuda prepare_step: " << token_ids.size() << " token ids for a plan of " << plan.total_q() << " tokens");
  m.reset_scratch();
  m.in_step = true;

  const int32_t num_seqs = plan.num_seqs();
  auto state = std::make_shared<StepState>();
  state->host_last_rows = plan.last_rows();
  std::vector<int32_t> cu_k(static_cast<size_t>(num_seqs) + 1, 0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t q_len = plan.cu_seqlens_q()[s + 1] - plan.cu_seqlens_q()[s];
    state->max_q_len = std::max(state->max_q_len, q_len);
    state->max_kv_len = std::max(state->max_kv_len, plan.kv_lens()[s]);
    cu_k[s + 1] = cu_k[s] + plan.kv_lens()[s];
  }
  state->total_k = cu_k.back();
  if (plan.paged()) {
    while (state->decode_rows < num_seqs && plan.cu_seqlens_q()[state->decode_rows + 1] - plan.cu_seqlens_q()[state->decode_rows] == 1) {
      ++state->decode_rows;
    }
  }
  std::vector<int32_t> cu_k_tail(cu_k.begin() + state->decode_rows, cu_k.end());
  for (int32_t& k : cu_k_tail) k -= cu_k[static_cast<size_t>(state->decode_rows)];
  state->tail_total_k = cu_k_tail.back();
  // Block tables go up padded to a power-of-two width, so decode steps of one batch size keep one
  // layout (and one captured graph) while their contexts grow within the bucket.
  const int32_t width = std::max<int32_t>(plan.max_blocks_per_seq(), 1);
  int32_t padded = 4;
  while (padded < width) padded *= 2;
  state->table_width = padded;
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * padded, -1);
  for (int32_t s = 0; s < num_seqs && plan.paged(); ++s) {
    std::copy_n(plan.block_tables().begin() + static_cast<ptrdiff_t>(s) * width, width,
                tables.begin() + static_cast<ptrdiff_t>(s) * padded);
  }
  std::vector<int32_t> segment_ends;
  for (const kernels::MaskParams& mask : plan.masks()) {
    segment_ends.insert(segment_ends.end(), mask.segment_ends, mask.segment_ends + mask.num_segments);
  }

  // One staging layout, every array on a kAlign boundary; the variable-length ones last, so a
  // decode step's layout depends only on its batch size and table width.
  struct Slice {
    const void* src;
    size_t bytes;
    size_t offset = 0;
  };
  enum { kIds, kCuQ, kCuK, kCuKTail, kKvLens, kPositions, kSlots, kLastRows, kMasks, kTables, kSegments, kSlices };
  std::vector<Slice> slices{
      {token_ids.data(), static_cast<size_t>(plan.total_q()) * 4},
      {plan.cu_seqlens_q().data(), plan.cu_seqlens_q().size() * 4},
      {cu_k.data(), cu_k.size() * 4},
      {cu_k_tail.data(), cu_k_tail.size() * 4},
      {plan.kv_lens().data(), plan.kv_lens().size() * 4},
      {plan.positions().data(), plan.positions().size() * 4},
      {plan.slot_mapping().data(), plan.slot_mapping().size() * 4},
      {state->host_last_rows.data(), state->host_last_rows.size() * 4},
      {plan.masks().data(), plan.masks().size() * sizeof(kernels::MaskParams)},
      {tables.data(), tables.size() * 4},
      {segment_ends.data(), segment_ends.size() * 4},
  };
  size_t total = 0;
  for (Slice& s : slices) {
    s.offset = total;
    total += round_up(std::max<size_t>(s.bytes, 1), kAlign);
  }
  // The previous step's copy must have read the host buffer before it is rewritten or freed.
  m.check(cudaEventSynchronize(m.staged), "staging");
  if (total > m.staging_bytes) {
    if (m.staging_host != nullptr) cudaFreeHost(m.staging_host);
    if (m.staging_device != nullptr) {
      m.check(cudaStreamSynchronize(m.stream), "staging resize");
      cudaFree(m.staging_device);
    }
    const size_t bytes = round_up(total * 2, size_t{1} << 16);
    m.check(cudaMallocHost(&m.staging_host, bytes), "pinned staging buffer");
    m.staging_device = m.device_alloc(bytes, "the step staging buffer");
    m.staging_bytes = bytes;
    m.layout_moved();  // captured graphs point into the old buffer
  }
  char* host = static_cast<char*>(m.staging_host);
  char* dev = static_cast<char*>(m.staging_device);
  for (const Slice& s : slices) {
    if (s.bytes > 0 && s.src != nullptr) std::memcpy(host + s.offset, s.src, s.bytes);
  }
  // Masks point at their segment ends: rewrite those pointers to the device copy.
  auto* masks = reinterpret_cast<kernels::MaskParams*>(host + slices[kMasks].offset);
  const auto* dev_segments = reinterpret_cast<const int32_t*>(dev + slices[kSegments].offset);
  size_t seg = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    masks[s].segment_ends = masks[s].num_segments > 0 ? dev_segments + seg : nullptr;
    seg += static_cast<size_t>(masks[s].num_segments);
  }
  m.check(cudaMemcpyAsync(dev, host, total, cudaMemcpyHostToDevice, m.stream), "plan upload");
  m.check(cudaEventRecord(m.staged, m.stream), "staging");

  auto at = [&](int i) { return reinterpret_cast<int32_t*>(dev + slices[static_cast<size_t>(i)].offset); };
  state->cu_seqlens_q = at(kCuQ);
  state->cu_seqlens_k = at(kCuK);
  state->cu_seqlens_k_tail = at(kCuKTail);
  state->kv_lens = at(kKvLens);
  state->positions = at(kPositions);
  state->block_tables = at(kTables);
  state->slot_mapping = at(kSlots);
  state->last_rows = at(kLastRows);
  state->masks = reinterpret_cast<const kernels::MaskParams*>(dev + slices[kMasks].offset);
  // A captured decode step plans its split for the bucket's longest context, so that every step
  // replaying it is covered; an eager step plans for the real one.
  state->graph_eligible = m.config.cuda_graphs && plan.paged() && state->max_q_len == 1;
  state->decode_context = state->graph_eligible ? padded * plan.block_size() : state->max_kv_len;
  m.current_step = state;
  plan.backend_state = state;
  if (token_ids.empty()) return {};
  return Tensor(nullptr, at(kIds), ScalarType::kI32, {plan.total_q()}, DeviceKind::kCuda, "token_ids");
}

std::vector<int32_t> CudaBackend::decode_batch_ladder(int32_t max_batch) const {
  std::vector<int32_t> ladder;
  if (!impl_->config.cuda_graphs || max_batch < 1) return ladder;
  for (int32_t b = 1; b < max_batch;) {
    ladder.push_back(b);
    b = b < 8 ? b * 2 : b + (b & (b - 1) ? b / 3 : b / 2);  // 8, 12, 16, 24, 32, 48, 64, 96, ...
  }
  ladder.push_back(max_batch);
  return ladder;
}

int64_t CudaBackend::workspace_regrowths() const { return impl_->regrowths; }
int64_t CudaBackend::fp8_w8a8_gemms() const { return impl_->fp8_w8a8_gemms; }
int64_t CudaBackend::dequantized_gemms() const { return impl_->dequantized_gemms; }
int64_t CudaBackend::dense_weight_buffer_bytes() const { return static_cast<int64_t>(impl_->dense_weight_bytes); }

double CudaBackend::time_ms(const std::function<void()>& work) {
  Impl& m = *impl_;
  cudaEvent_t start = nullptr, stop = nullptr;
  m.check(cudaEventCreate(&start), "timing event");
  m.check(cudaEventCreate(&stop), "timing event");
  float ms = 0.0f;
  try {
    m.check(cudaEventRecord(start, m.stream), "timing event record");
    work();
    m.check(cudaEventRecord(stop, m.stream), "timing event record");
    m.check(cudaEventSynchronize(stop), "timing event wait");
    m.check(cudaEventElapsedTime(&ms, start, stop), "timing event elapsed");
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

Tensor CudaBackend::run_step(const std::function<Tensor()>& forward) {
  Impl& m = *impl_;
  const std::shared_ptr<StepState> st = m.current_step;
  if (st == nullptr || !st->graph_eligible) return forward();
  if (const int64_t generation = m.layout_generation + m.freed->load(); generation != m.graphs_generation) {
    m.drop_graphs();
    m.graphs_generation = generation;
  }
  const Impl::GraphKey key{static_cast<int32_t>(st->host_last_rows.size()), st->table_width};
  if (auto it = m.graphs.find(key); it != m.graphs.end()) {
    m.check(cudaGraphLaunch(it->second.exec, m.stream), "decode graph replay");
    ++m.replays;
    return it->second.output;
  }
  // The first step of a shape runs eagerly: it sizes the workspaces and plans the GEMMs, which a
  // capture cannot do. The next one is captured.
  if (m.warmed.insert(key).second) return forward();
  if (m.graphs.size() >= Impl::kMaxGraphs) m.drop_graphs();  // many shapes seen: start over
  m.capturing = true;
  m.check(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "decode graph capture");
  Tensor output;
  cudaGraph_t graph = nullptr;
  try {
    output = forward();
  } catch (...) {
    cudaStreamEndCapture(m.stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    m.capturing = false;
    throw;
  }
  m.capturing = false;
  m.check(cudaStreamEndCapture(m.stream, &graph), "decode graph capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  m.check(e, "decode graph instantiate");
  m.graphs[key] = {exec, output};
  ++m.captured;
  m.check(cudaGraphLaunch(exec, m.stream), "decode graph replay");
  return output;
}

// ---------------------------------------------------------------- ops

namespace {

void check_device(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.defined(), "cuda " << op << ": an operand is undefined");
  TESSERA_CHECK(t.device() == DeviceKind::kCuda, "cuda " << op << ": " << t.describe() << " is not in device memory");
}

// A 2-D tensor of the activation dtype with `cols` columns.
void check_matrix(const Tensor& t, const char* op, int64_t cols, ScalarType type) {
  check_device(t, op);
  TESSERA_CHECK(t.type() == type, "cuda " << op << ": " << t.describe() << " must be " << scalar_type_name(type));
  TESSERA_CHECK(t.shape().size() == 2 && t.dim(1) == cols,
                "cuda " << op << ": " << t.describe() << " must be [rows, " << cols << "]");
}

int as_int(int64_t v, const char* what) {
  TESSERA_CHECK(v >= 0 && v <= INT32_MAX, "cuda: " << what << " " << v << " does not fit the kernels' int range");
  return static_cast<int>(v);
}

}  // namespace

void CudaBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool accumulate) {
  Impl& m = *impl_;
  check_device(ids, "embedding");
  TESSERA_CHECK(ids.type() == ScalarType::kI32, "cuda embedding: ids " << ids.describe() << " must be i32");
  TESSERA_CHECK(table.shape().size() == 2, "cuda embedding: table " << table.describe() << " must be [vocab, dim]");
  check_matrix(table, "embedding", table.dim(1), m.config.dtype);
  check_matrix(out, "embedding", table.dim(1), m.config.dtype);
  TESSERA_CHECK(out.dim(0) == ids.numel(), "cuda embedding: " << out.describe() << " for " << ids.describe());
  const int tokens = as_int(ids.numel(), "tokens");
  const int hidden = as_int(table.dim(1), "hidden");
  const int vocab = as_int(table.dim(0), "vocab");
  m.check_supported(kc::embedding_unsupported(tokens, hidden, vocab), "embedding");
  m.check(kc::embedding_gather(m.kdtype, out.data(), table.data(), ids.i32(), tokens, hidden, vocab, m.stream,
                               accumulate),
          "embedding", table);
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  Impl& m = *impl_;
  check_device(w, "linear");
  TESSERA_CHECK(w.shape().size() == 2, "cuda linear: weight " << w.describe() << " must be [out, in]");
  check_matrix(x, "linear", w.dim(1), m.config.dtype);
  check_matrix(y, "linear", w.dim(0), m.config.dtype);
  TESSERA_CHECK(y.dim(0) == x.dim(0), "cuda linear: " << y.describe() << " for input " << x.describe());
  if (bias != nullptr) {
    check_device(*bias, "linear");
    TESSERA_CHECK(bias->numel() == w.dim(0), "cuda linear: bias " << bias->describe() << " for " << w.describe());
  }
  if (x.dim(0) == 0) return;
  const int rows = as_int(x.dim(0), "rows");
  const int out_features = as_int(w.dim(0), "out features");
  const int in_features = as_int(w.dim(1), "in features");
  if (scalar_type_is_gpu_quantized(w.type())) {
    // A quantized weight: the quantized GEMV for decode-sized inputs, which reads the weight as
    // stored; for more rows, Impl::gemm (W8A8 for fp8_e4m3, a bf16 expansion for the others).
    TESSERA_CHECK(m.kdtype == kc::DType::kBF16, "cuda linear: quantized weight " << w.describe() << " needs bf16 activations");
    const kc::WeightFormat format = weight_format_of(w.type());
    if (rows <= kc::kGemvMaxM) {
      // Never the dequantize-then-GEMM path at these sizes: GemmRunner's GEMV kernel reads its weight
      // before the kernel ahead of it (the dequantization) has finished.
      m.check_supported(kc::quantized_gemv_supported(format, rows, out_features, in_features, x.data(), w.data())
                            ? ""
                            : "quantized GEMV of " + w.describe() + " for " + x.describe() + " (16-byte alignment)",
                        "linear");
      m.check(kc::quantized_gemv(m.kdtype, format, y.data(), x.data(), w.data(), bias ? bias->data() : nullptr, rows,
                                 out_features, in_features, m.stream),
              "quantized_gemv", w);
      return;
    }
  } else {
    TESSERA_CHECK(w.type() == m.config.dtype,
                  "cuda linear: weight " << w.describe() << " must be " << scalar_type_name(m.config.dtype)
                                         << " or a quantized format");
  }
  m.gemm(x, w, bias ? bias->data() : nullptr, y.data(), rows, out_features, in_features, "linear");
}

void CudaBackend::linear_silu_mul(const Tensor& x, const Tensor& w, Tensor& out) {
  Impl& m = *impl_;
  check_device(w, "linear_silu_mul");
  TESSERA_CHECK(w.shape().size() == 2 && w.dim(0) % 2 == 0,
                "cuda linear_silu_mul: weight " << w.describe() << " must be [2 * dim, in] (gate and up stacked)");
  check_matrix(x, "linear_silu_mul", w.dim(1), m.config.dtype);
  check_matrix(out, "linear_silu_mul", w.dim(0) / 2, m.config.dtype);
  TESSERA_CHECK(out.dim(0) == x.dim(0), "cuda linear_silu_mul: " << out.describe() << " for input " << x.describe());
  if (x.dim(0) == 0) return;
  const int rows = as_int(x.dim(0), "rows");
  const int n = as_int(w.dim(0), "out features");
  const int k = as_int(w.dim(1), "in features");
  m.check_supported(kc::activation_unsupported(rows, n / 2), "linear_silu_mul");
  // Decode sizes: one GEMV whose epilogue applies silu(gate) · up (w is in pairs order, load_stacked).
  if (scalar_type_is_gpu_quantized(w.type())) {
    TESSERA_CHECK(m.kdtype == kc::DType::kBF16,
                  "cuda linear_silu_mul: quantized weight " << w.describe() << " needs bf16 activations");
    const kc::WeightFormat format = weight_format_of(w.type());
    if (rows <= kc::kGemvMaxM) {
      m.check_supported(kc::quantized_gemv_supported(format, rows, n, k, x.data(), w.data())
                            ? ""
                            : "quantized GEMV of " + w.describe() + " for " + x.describe() + " (16-byte alignment)",
                        "linear_silu_mul");
      m.check(kc::quantized_gemv_silu_mul(m.kdtype, format, out.data(), x.data(), w.data(), rows, n, k, m.stream),
              "quantized_gemv_silu_mul", w);
      return;
    }
  } else {
    TESSERA_CHECK(w.type() == m.config.dtype, "cuda linear_silu_mul: weight " << w.describe() << " must be "
                                                                             << scalar_type_name(m.config.dtype)
                                                                             << " or a quantized format");
    if (kc::gemv_supported(rows, n, k, x.data(), w.data())) {
      m.check(kc::gemv_silu_mul(m.kdtype, out.data(), x.data(), w.data(), rows, n, k, m.stream), "gemv_silu_mul", w);
      return;
    }
  }
  // Prefill sizes: the GEMM's output (columns alternating gate and up, as the weight's rows are
  // stored: a W8A8 GEMM's per-channel scales follow the same order), then silu_mul over the pairs.
  // Its buffer is the step's, reused by every layer (the stream orders them).
  const size_t bytes = static_cast<size_t>(rows) * n * scalar_type_bytes(m.config.dtype);
  void* product = m.step_shared(&StepState::gate_up_product, &StepState::gate_up_product_bytes, bytes);
  m.gemm(x, w, nullptr, product, rows, n, k, "linear_silu_mul");
  m.check(kc::silu_mul_pairs(m.kdtype, out.data(), product, rows, n / 2, m.stream), "silu_mul_pairs", out);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  Impl& m = *impl_;
  check_matrix(x, "rms_norm", w.numel(), m.config.dtype);
  check_matrix(out, "rms_norm", w.numel(), m.config.dtype);
  TESSERA_CHECK(out.dim(0) == x.dim(0), "cuda rms_norm: " << out.describe() << " for " << x.describe());
  const int tokens = as_int(x.dim(0), "tokens");
  const int hidden = as_int(x.dim(1), "hidden");
  m.check_supported(kc::norm_unsupported(tokens, hidden, hidden, hidden), "rms_norm");
  m.check(kc::rmsnorm(m.kdtype, out.data(), x.data(), w.data(), tokens, hidden, hidden, hidden, eps, m.stream),
          "rms_norm", x);
}

void CudaBackend::add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  Impl& m = *impl_;
  check_matrix(x, "add_rms_norm", w.numel(), m.config.dtype);
  check_matrix(residual, "add_rms_norm", w.numel(), m.config.dtype);
  TESSERA_CHECK(residual.dim(0) == x.dim(0), "cuda add_rms_norm: " << residual.describe() << " for " << x.describe());
  const int tokens = as_int(x.dim(0), "tokens");
  const int hidden = as_int(x.dim(1), "hidden");
  m.check_supported(kc::norm_unsupported(tokens, hidden, hidden, hidden), "add_rms_norm");
  m.check(kc::fused_add_rmsnorm(m.kdtype, x.data(), residual.data(), w.data(), tokens, hidden, hidden, eps, m.stream),
          "add_rms_norm", x);
}

void CudaBackend::layer_norm(Tensor& x, const Tensor* residual, const Tensor& w, const Tensor& b, float eps) {
  Impl& m = *impl_;
  check_matrix(x, "layer_norm", w.numel(), m.config.dtype);
  TESSERA_CHECK(b.numel() == w.numel(), "cuda layer_norm: bias " << b.describe() << " for " << w.describe());
  if (residual != nullptr) {
    check_matrix(*residual, "layer_norm", w.numel(), m.config.dtype);
    TESSERA_CHECK(residual->dim(0) == x.dim(0), "cuda layer_norm: " << residual->describe() << " for " << x.describe());
  }
  const int tokens = as_int(x.dim(0), "tokens");
  const int hidden = as_int(x.dim(1), "hidden");
  m.check_supported(kc::norm_unsupported(tokens, hidden, hidden, hidden), "layer_norm");
  m.check(kc::layernorm(m.kdtype, x.data(), x.data(), residual ? residual->data() : nullptr, w.data(), b.data(), tokens,
                        hidden, eps, m.stream),
          "layer_norm", x);
}

void CudaBackend::copy_kv_rows(KvCacheStorage& cache, std::span<const int32_t> src_slots,
                               std::span<const int32_t> dst_slots, std::span<const int32_t> rotate_by,
                               const Tensor& inv_freq) {
  Impl& m = *impl_;
  m.check_healthy();
  TESSERA_CHECK(src_slots.size() == dst_slots.size() && src_slots.size() == rotate_by.size(),
                "cuda copy_kv_rows: " << src_slots.size() << " sources, " << dst_slots.size() << " destinations, "
                                      << rotate_by.size() << " rotations");
  check_device(inv_freq, "copy_kv_rows");
  TESSERA_CHECK(inv_freq.type() == ScalarType::kF32 && inv_freq.numel() == cache.head_dim / 2,
                "cuda copy_kv_rows: " << inv_freq.describe() << " must be f32[" << cache.head_dim / 2 << "]");
  const int rows = as_int(static_cast<int64_t>(src_slots.size()), "rows");
  if (rows == 0) return;
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  std::vector<int32_t> packed;  // src, dst, rotate_by: one upload
  packed.reserve(3 * src_slots.size());
  for (std::span<const int32_t> part : {src_slots, dst_slots, rotate_by}) packed.insert(packed.end(), part.begin(), part.end());
  for (int r = 0; r < rows; ++r) {
    TESSERA_CHECK(packed[r] >= 0 && packed[r] < num_slots && packed[rows + r] >= 0 && packed[rows + r] < num_slots,
                  "cuda copy_kv_rows: slot " << packed[r] << " -> " << packed[rows + r] << " outside " << num_slots);
  }
  if (!m.kv_copy_indices.defined() || m.kv_copy_indices.numel() < static_cast<int64_t>(packed.size())) {
    m.kv_copy_indices = m.make({static_cast<int64_t>(packed.size())}, ScalarType::kI32, "kv_copy_indices", true);
  }
  // From pageable memory the copy is staged before it returns, so `packed` may go out of scope.
  m.check(cudaMemcpyAsync(m.kv_copy_indices.data(), packed.data(), packed.size() * 4, cudaMemcpyHostToDevice, m.stream),
          "copy_kv_rows indices");
  m.check_supported(
      kc::kv_cache_copy_rotate_unsupported(m.kdtype, rows, cache.num_kv_heads, cache.head_dim, m.kv_kdtype),
      "copy_kv_rows");
  const int32_t* idx = static_cast<const int32_t*>(m.kv_copy_indices.data());
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    m.check_kv_tensor(cache.k[l], "copy_kv_rows");
    m.check(kc::kv_cache_copy_rotate(m.kdtype, cache.k[l].data(), cache.v[l].data(), idx, idx + rows, idx + 2 * rows,
                                     rows, cache.num_kv_heads, cache.head_dim, inv_freq.f32(), m.stream, m.kv_kdtype),
            "copy_kv_rows", cache.k[l]);
  }
}

void CudaBackend::rope(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, const AttentionPlan& plan) {
  Impl& m = *impl_;
  check_matrix(qkv, "rope", layout.row_width(), m.config.dtype);
  TESSERA_CHECK(qkv.dim(0) == plan.total_q(),
                "cuda rope: " << qkv.describe() << " for a plan of " << plan.total_q() << " tokens");
  check_device(inv_freq, "rope");
  TESSERA_CHECK(inv_freq.type() == ScalarType::kF32 && inv_freq.numel() == layout.head_dim / 2,
                "cuda rope: " << inv_freq.describe() << " must be f32[" << layout.head_dim / 2 << "]");
  const StepState& st = m.step(plan, "rope");
  const int tokens = as_int(qkv.dim(0), "tokens");
  const int64_t stride = layout.row_width();
  m.check_supported(kc::rope_unsupported(tokens, layout.num_heads, layout.num_kv_heads, layout.head_dim, stride, stride),
                    "rope");
  char* base = static_cast<char*>(qkv.data());
  const int64_t elem = scalar_type_bytes(m.config.dtype);
  m.check(kc::rope_inplace(m.kdtype, base + layout.q_offset() * elem, base + layout.k_offset() * elem, st.positions,
                           tokens, layout.num_heads, layout.num_kv_heads, layout.head_dim, stride, stride,
                           inv_freq.f32(), m.stream),
          "rope", qkv);
}

void CudaBackend::attention(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                            KvCacheStorage* cache, int64_t layer, Tensor& out) {
  attend(qkv, layout, scale, plan, cache, layer, out, nullptr);
}

void CudaBackend::rope_attention(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, float scale,
                                 const AttentionPlan& plan, KvCacheStorage* cache, int64_t layer, Tensor& out) {
  if (!plan.paged()) {  // no cache to write: attention reads the packed k, rotated in place
    rope(qkv, layout, inv_freq, plan);
    attend(qkv, layout, scale, plan, cache, layer, out, nullptr);
    return;
  }
  check_device(inv_freq, "rope_attention");
  TESSERA_CHECK(inv_freq.type() == ScalarType::kF32 && inv_freq.numel() == layout.head_dim / 2,
                "cuda rope_attention: " << inv_freq.describe() << " must be f32[" << layout.head_dim / 2 << "]");
  attend(qkv, layout, scale, plan, cache, layer, out, &inv_freq);
}

void CudaBackend::attend(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                         KvCacheStorage* cache, int64_t layer, Tensor& out, const Tensor* rope_inv_freq) {
  Impl& m = *impl_;
  check_matrix(qkv, "attention", layout.row_width(), m.config.dtype);
  check_matrix(out, "attention", static_cast<int64_t>(layout.num_heads) * layout.head_dim, m.config.dtype);
  TESSERA_CHECK(qkv.dim(0) == plan.total_q() && out.dim(0) == plan.total_q(),
                "cuda attention: " << qkv.describe() << " -> " << out.describe() << " for a plan of "
                                   << plan.total_q() << " tokens");
  StepState& st = m.step(plan, "attention");
  const int64_t elem = scalar_type_bytes(m.config.dtype);
  const char* base = static_cast<const char*>(qkv.data());
  const void* q = base + layout.q_offset() * elem;
  const void* k = base + layout.k_offset() * elem;
  const void* v = base + layout.v_offset() * elem;
  const int64_t stride = layout.row_width();
  const int64_t kv_width = static_cast<int64_t>(layout.num_kv_heads) * layout.head_dim;
  const int tokens = as_int(plan.total_q(), "tokens");

  kc::PrefillArgs pa;
  pa.out = out.data();
  pa.q = q;
  pa.cu_seqlens_q = st.cu_seqlens_q;
  pa.cu_seqlens_k = st.cu_seqlens_k;
  pa.masks = st.masks;
  pa.num_seqs = plan.num_seqs();
  pa.max_seqlen_q = st.max_q_len;
  pa.num_heads = layout.num_heads;
  pa.num_kv_heads = layout.num_kv_heads;
  pa.head_dim = layout.head_dim;
  pa.q_row_stride = stride;
  pa.out_row_stride = out.dim(1);
  pa.softmax_scale = scale;

  // The generic kernel serves the shapes the fast kernels do not (head_dim 16, 80, 96, ...).
  kc::GenericAttentionArgs ga;
  ga.out = out.data();
  ga.q = q;
  ga.cu_seqlens_q = st.cu_seqlens_q;
  ga.masks = st.masks;
  ga.num_seqs = plan.num_seqs();
  ga.total_q = tokens;
  ga.num_heads = layout.num_heads;
  ga.num_kv_heads = layout.num_kv_heads;
  ga.head_dim = layout.head_dim;
  ga.q_row_stride = stride;
  ga.out_row_stride = out.dim(1);
  ga.softmax_scale = scale;

  if (!plan.paged()) {
    TESSERA_CHECK(cache == nullptr, "cuda attention: a KV cache was given but the plan has none");
    pa.k = k;
    pa.v = v;
    pa.k_row_stride = stride;
    pa.v_row_stride = stride;
    if (kc::prefill_unsupported(m.kdtype, pa).empty()) {
      m.check(kc::prefill_attention(m.kdtype, pa, m.stream), "attention (prefill)", qkv);
      return;
    }
    ga.k = k;
    ga.v = v;
    ga.k_row_stride = stride;
    ga.v_row_stride = stride;
    ga.cu_seqlens_k = st.cu_seqlens_k;
    m.check_supported(kc::generic_attention_unsupported(m.kdtype, ga), "attention");
    m.check(kc::generic_attention(m.kdtype, ga, m.stream), "attention (generic)", qkv);
    return;
  }

  TESSERA_CHECK(cache != nullptr, "cuda attention: the plan is paged but no KV cache was given");
  TESSERA_CHECK(layer >= 0 && layer < cache->num_layers(),
                "cuda attention: layer " << layer << " of a " << cache->num_layers() << "-layer cache");
  TESSERA_CHECK(cache->block_size == plan.block_size() && cache->num_kv_heads == layout.num_kv_heads &&
                    cache->head_dim == layout.head_dim,
                "cuda attention: cache (block_size " << cache->block_size << ", kv heads " << cache->num_kv_heads
                                                     << ", head_dim " << cache->head_dim
                                                     << ") does not match the plan/layout");
  Tensor& k_cache = cache->k[layer];
  Tensor& v_cache = cache->v[layer];
  m.check_kv_tensor(k_cache, "attention");
  m.check_kv_tensor(v_cache, "attention");
  const int64_t num_slots = static_cast<int64_t>(cache->num_blocks) * cache->block_size;
  if (rope_inv_freq != nullptr) {
    // rope_attention: q rotated in place and K rotated into the cache by one kernel. Only
    // rope_attention passes rope_inv_freq, and its qkv is mutable.
    m.check_supported(kc::kv_cache_append_rope_unsupported(m.kdtype, tokens, layout.num_heads, layout.num_kv_heads,
                                                           layout.head_dim, stride, stride, stride, num_slots,
                                                           m.kv_kdtype),
                      "rope_attention");
    m.check(kc::kv_cache_append_rope(m.kdtype, k_cache.data(), v_cache.data(), const_cast<void*>(q), stride, k, stride,
                                     v, stride, st.positions, st.slot_mapping, tokens, layout.num_heads,
                                     layout.num_kv_heads, layout.head_dim, num_slots, rope_inv_freq->f32(), m.stream,
                                     m.kv_kdtype),
            "kv_cache_append_rope", k_cache);
  } else {
    m.check_supported(kc::kv_cache_append_unsupported(m.kdtype, tokens, layout.num_kv_heads, layout.head_dim, stride,
                                                      stride, num_slots, m.kv_kdtype),
                      "kv_cache_append");
    m.check(kc::kv_cache_append(m.kdtype, k_cache.data(), v_cache.data(), k, stride, v, stride, st.slot_mapping,
                                tokens, layout.num_kv_heads, layout.head_dim, num_slots, m.stream, m.kv_kdtype),
            "kv_cache_append", k_cache);
  }

  // The decode kernel over the step's first `decode_rows` sequences (one query row each).
  kc::DecodeArgs da;
  da.out = out.data();
  da.q = q;
  da.k_cache = k_cache.data();
  da.v_cache = v_cache.data();
  da.block_tables = st.block_tables;
  da.context_lens = st.kv_lens;
  da.masks = st.masks;
  da.num_seqs = st.decode_rows;
  da.num_heads = layout.num_heads;
  da.num_kv_heads = layout.num_kv_heads;
  da.head_dim = layout.head_dim;
  da.block_size = cache->block_size;
  da.max_blocks_per_seq = st.table_width;
  da.max_context_len = st.decode_context;
  da.softmax_scale = scale;
  da.q_row_stride = stride;
  da.out_row_stride = out.dim(1);
  da.min_split_tokens = m.config.decode_split_min_tokens;
  da.kv_dtype = m.kv_kdtype;
  const bool decode_fast = st.decode_rows > 0 && kc::decode_unsupported(m.kdtype, da).empty();
  auto run_decode = [&] {
    m.check(kc::decode_attention(m.kdtype, da, m.decode_scratch(da), m.num_sms, m.stream),
            "attention (decode)", qkv);
  };
  if (st.max_q_len == 1 && decode_fast) {
    run_decode();
    return;
  }

  // Prefill, chunked prefill and mixed steps: the fast prefill kernel reads each sequence's keys
  // contiguously, so the paged K/V of the step's prompt chunks is gathered once per layer into one
  // workspace slice. A mixed step's leading decode rows need no gather: the decode kernel reads
  // their keys in place.
  pa.k_row_stride = kv_width;
  pa.v_row_stride = kv_width;
  if (kc::prefill_unsupported(m.kdtype, pa).empty()) {
    const int32_t first = decode_fast ? st.decode_rows : 0;
    const int32_t seqs = plan.num_seqs() - first;
    const int32_t total_k = decode_fast ? st.tail_total_k : st.total_k;
    const int32_t* cu_k = decode_fast ? st.cu_seqlens_k_tail : st.cu_seqlens_k;
    const int32_t* tables = st.block_tables + static_cast<ptrdiff_t>(first) * st.table_width;
    if (st.gathered_k == nullptr) {
      const size_t bytes = static_cast<size_t>(total_k) * kv_width * elem;
      st.gathered_k = m.scratch(bytes);
      st.gathered_v = m.scratch(bytes);
    }
    m.check_supported(kc::kv_cache_gather_unsupported(m.kdtype, st.table_width, seqs, total_k, cache->block_size,
                                                      layout.num_kv_heads, layout.head_dim, cache->num_blocks,
                                                      m.kv_kdtype),
                      "kv_cache_gather");
    // Gathered rows are in the activation dtype (an e4m3 cache is widened here), so the prefill
    // kernel reads them as it reads any K/V.
    m.check(kc::kv_cache_gather(m.kdtype, st.gathered_k, st.gathered_v, k_cache.data(), v_cache.data(), tables,
                                st.table_width, cu_k, seqs, total_k, cache->block_size, layout.num_kv_heads,
                                layout.head_dim, cache->num_blocks, m.stream, m.kv_kdtype),
            "kv_cache_gather", k_cache);
    if (decode_fast) run_decode();
    pa.k = st.gathered_k;
    pa.v = st.gathered_v;
    pa.cu_seqlens_q = st.cu_seqlens_q + first;
    pa.cu_seqlens_k = cu_k;
    pa.masks = st.masks + first;
    pa.num_seqs = seqs;
    m.check(kc::prefill_attention(m.kdtype, pa, m.stream), "attention (prefill)", qkv);
    return;
  }
  ga.k = k_cache.data();
  ga.v = v_cache.data();
  ga.block_tables = st.block_tables;
  ga.max_blocks_per_seq = st.table_width;
  ga.block_size = cache->block_size;
  ga.kv_lens = st.kv_lens;
  ga.kv_dtype = m.kv_kdtype;
  m.check_supported(kc::generic_attention_unsupported(m.kdtype, ga), "attention");
  m.check(kc::generic_attention(m.kdtype, ga, m.stream), "attention (generic)", qkv);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  Impl& m = *impl_;
  check_device(out, "silu_mul");
  TESSERA_CHECK(out.shape().size() == 2, "cuda silu_mul: " << out.describe() << " must be [rows, dim]");
  check_matrix(out, "silu_mul", out.dim(1), m.config.dtype);
  check_matrix(gate_up, "silu_mul", 2 * out.dim(1), m.config.dtype);
  TESSERA_CHECK(gate_up.dim(0) == out.dim(0), "cuda silu_mul: " << out.describe() << " for " << gate_up.describe());
  const int tokens = as_int(out.dim(0), "tokens");
  const int inter = as_int(out.dim(1), "width");
  m.check_supported(kc::activation_unsupported(tokens, inter), "silu_mul");
  m.check(kc::silu_mul(m.kdtype, out.data(), gate_up.data(), tokens, inter, m.stream), "silu_mul", out);
}

void CudaBackend::add(const Tensor& x, Tensor& residual) {
  Impl& m = *impl_;
  TESSERA_CHECK(x.shape().size() == 2 && x.shape() == residual.shape(),
                "cuda add: " << x.describe() << " and " << residual.describe() << " must be one [rows, dim] shape");
  check_matrix(x, "add", x.dim(1), m.config.dtype);
  check_matrix(residual, "add", x.dim(1), m.config.dtype);
  const int tokens = as_int(x.dim(0), "tokens");
  const int width = as_int(x.dim(1), "width");
  m.check_supported(kc::activation_unsupported(tokens, width), "add");
  m.check(kc::add_residual(m.kdtype, residual.data(), x.data(), tokens, width, m.stream), "add", residual);
}

void CudaBackend::concat_columns(std::span<const Tensor* const> parts, Tensor& out) {
  Impl& m = *impl_;
  TESSERA_CHECK(!parts.empty(), "cuda concat_columns: no parts for " << out.describe());
  TESSERA_CHECK(out.shape().size() == 2, "cuda concat_columns: " << out.describe() << " must be [rows, cols]");
  check_matrix(out, "concat_columns", out.dim(1), m.config.dtype);
  int64_t cols = 0;
  for (const Tensor* part : parts) {
    TESSERA_CHECK(part->shape().size() == 2 && part->dim(0) == out.dim(0),
                  "cuda concat_columns: " << part->describe() << " is not [" << out.dim(0) << ", cols] like "
                                          << out.describe());
    check_matrix(*part, "concat_columns", part->dim(1), m.config.dtype);
    cols += part->dim(1);
  }
  TESSERA_CHECK(cols == out.dim(1), "cuda concat_columns: parts have " << cols << " columns, " << out.describe());
  if (out.dim(0) == 0) return;
  const size_t element = scalar_type_bytes(m.config.dtype);
  const size_t out_pitch = static_cast<size_t>(out.dim(1)) * element;
  size_t offset = 0;
  for (const Tensor* part : parts) {
    const size_t width = static_cast<size_t>(part->dim(1)) * element;
    if (width != 0) {
      m.check(cudaMemcpy2DAsync(static_cast<char*>(out.data()) + offset, out_pitch, part->data(), width, width,
                                static_cast<size_t>(out.dim(0)), cudaMemcpyDeviceToDevice, m.stream),
              "concat_columns", out);
    }
    offset += width;
  }
}

void CudaBackend::gelu(Tensor& x) {
  Impl& m = *impl_;
  check_device(x, "gelu");
  TESSERA_CHECK(x.shape().size() == 2, "cuda gelu: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "gelu", x.dim(1), m.config.dtype);
  const int tokens = as_int(x.dim(0), "tokens");
  const int width = as_int(x.dim(1), "width");
  m.check_supported(kc::activation_unsupported(tokens, width), "gelu");
  m.check(kc::bias_gelu(m.kdtype, x.data(), nullptr, tokens, width, m.stream), "gelu", x);
}

void CudaBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  Impl& m = *impl_;
  check_device(x, "gather_rows");
  TESSERA_CHECK(x.shape().size() == 2, "cuda gather_rows: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "gather_rows", x.dim(1), m.config.dtype);
  check_matrix(out, "gather_rows", x.dim(1), m.config.dtype);
  TESSERA_CHECK(out.dim(0) == static_cast<int64_t>(rows.size()),
                "cuda gather_rows: " << out.describe() << " for " << rows.size() << " rows");
  for (size_t i = 0; i < rows.size(); ++i) {
    TESSERA_CHECK(rows[i] >= 0 && rows[i] < x.dim(0), "cuda gather_rows: row " << rows[i] << " of " << x.describe());
  }
  if (rows.empty()) return;
  // The usual rows (each sequence's last token) went up with the step's plan; any others go up now.
  const int32_t* device_rows = nullptr;
  Tensor uploaded;
  if (m.current_step != nullptr && std::ranges::equal(rows, m.current_step->host_last_rows)) {
    device_rows = m.current_step->last_rows;
  } else {
    uploaded = upload(rows, {static_cast<int64_t>(rows.size())}, "gather_rows.rows");
    device_rows = uploaded.i32();
  }
  const int width = as_int(x.dim(1), "width");
  m.check_supported(kc::rows_unsupported(m.kdtype, static_cast<int>(rows.size()), width), "gather_rows");
  m.check(kc::gather_rows(m.kdtype, out.data(), x.data(), device_rows, static_cast<int>(rows.size()), width, m.stream),
          "gather_rows", x);
}

void CudaBackend::pool(const Tensor& x, const AttentionPlan& plan, PoolMode mode, Tensor& out) {
  Impl& m = *impl_;
  check_device(x, "pool");
  TESSERA_CHECK(x.shape().size() == 2 && x.dim(0) == plan.total_q(),
                "cuda pool: " << x.describe() << " for a plan of " << plan.total_q() << " tokens");
  check_matrix(x, "pool", x.dim(1), m.config.dtype);
  check_matrix(out, "pool", x.dim(1), m.config.dtype);
  TESSERA_CHECK(out.dim(0) == plan.num_seqs(),
                "cuda pool: " << out.describe() << " for " << plan.num_seqs() << " sequences");
  const StepState& st = m.step(plan, "pool");
  const int width = as_int(x.dim(1), "width");
  const kc::PoolKind kind = mode == PoolMode::kMean ? kc::PoolKind::kMean : kc::PoolKind::kFirst;
  m.check_supported(kc::pool_rows_unsupported(m.kdtype, plan.num_seqs(), width, kind), "pool");
  m.check(kc::pool_rows(m.kdtype, out.data(), x.data(), st.cu_seqlens_q, plan.num_seqs(), width, kind, m.stream),
          "pool", x);
}

void CudaBackend::l2_normalize(Tensor& x) {
  Impl& m = *impl_;
  check_device(x, "l2_normalize");
  TESSERA_CHECK(x.shape().size() == 2, "cuda l2_normalize: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "l2_normalize", x.dim(1), m.config.dtype);
  const int rows = as_int(x.dim(0), "rows");
  const int width = as_int(x.dim(1), "width");
  m.check_supported(kc::rows_unsupported(m.kdtype, rows, width), "l2_normalize");
  m.check(kc::l2_normalize_rows(m.kdtype, x.data(), rows, width, 1e-12f, m.stream), "l2_normalize", x);
}

void CudaBackend::softmax(Tensor& x) {
  Impl& m = *impl_;
  check_device(x, "softmax");
  TESSERA_CHECK(x.shape().size() == 2, "cuda softmax: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "softmax", x.dim(1), m.config.dtype);
  const int rows = as_int(x.dim(0), "rows");
  const int width = as_int(x.dim(1), "width");
  m.check_supported(kc::rows_unsupported(m.kdtype, rows, width), "softmax");
  m.check(kc::softmax_rows(m.kdtype, x.data(), rows, width, m.stream), "softmax", x);
}

// ---------------------------------------------------------------- sampling

std::vector<SampleOutcome> CudaBackend::sample(const Tensor& logits, std::span<const SampleSpec> rows) {
  Impl& m = *impl_;
  m.check_healthy();
  check_device(logits, "sample");
  TESSERA_CHECK(logits.shape().size() == 2 && logits.dim(0) == static_cast<int64_t>(rows.size()),
                "cuda sample: " << logits.describe() << " for " << rows.size() << " rows");
  const int num_rows = static_cast<int>(rows.size());
  const int vocab = as_int(logits.dim(1), "vocab");
  if (num_rows == 0) return {};
  kc::LogitsType type = kc::LogitsType::kF32;
  if (logits.type() == ScalarType::kBF16) type = kc::LogitsType::kBF16;
  if (logits.type() == ScalarType::kF16) type = kc::LogitsType::kFP16;
  TESSERA_CHECK(type != kc::LogitsType::kF32 || logits.type() == ScalarType::kF32,
                "cuda sample: " << logits.describe() << " is not a float tensor");

  // Staging: [params][penalty tokens][penalty counts][out], each on a kAlign boundary.
  std::vector<kc::SamplingRowParams> params(rows.size());
  size_t penalties = 0;
  for (const SampleSpec& r : rows) penalties += r.penalty_tokens.size();
  const size_t params_bytes = round_up(params.size() * sizeof(kc::SamplingRowParams), kAlign);
  const size_t tokens_bytes = round_up(std::max<size_t>(penalties, 1) * 4, kAlign);
  const size_t out_bytes = round_up(rows.size() * sizeof(kc::SampledRow), kAlign);
  const size_t total = params_bytes + 2 * tokens_bytes + out_bytes;
  if (total > m.sample_bytes) {
    m.check(cudaStreamSynchronize(m.stream), "sampling buffers");
    if (m.sample_host != nullptr) cudaFreeHost(m.sample_host);
    if (m.sample_device != nullptr) cudaFree(m.sample_device);
    const size_t bytes = round_up(total * 2, size_t{1} << 16);
    m.check(cudaMallocHost(&m.sample_host, bytes), "pinned sampling buffer");
    m.sample_device = m.device_alloc(bytes, "the sampling buffer");
    m.sample_bytes = bytes;
  }
  char* host = static_cast<char*>(m.sample_host);
  char* dev = static_cast<char*>(m.sample_device);
  auto* tokens = reinterpret_cast<int32_t*>(host + params_bytes);
  auto* counts = reinterpret_cast<int32_t*>(host + params_bytes + tokens_bytes);
  int32_t at = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleSpec& r = rows[i];
    TESSERA_CHECK(r.penalty_counts.empty() || r.penalty_counts.size() == r.penalty_tokens.size(),
                  "cuda sample: row " << i << " has " << r.penalty_counts.size() << " penalty counts for "
                                      << r.penalty_tokens.size() << " tokens");
    kc::SamplingRowParams& p = params[i];
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    p.min_p = r.min_p;
    p.repetition_penalty = r.repetition_penalty;
    p.presence_penalty = r.presence_penalty;
    p.frequency_penalty = r.frequency_penalty;
    p.uniform = static_cast<float>(r.uniform);
    p.num_top_logprobs = r.num_top_logprobs;
    p.penalty_begin = at;
    for (size_t j = 0; j < r.penalty_tokens.size(); ++j) {
      tokens[at] = r.penalty_tokens[j];
      counts[at] = r.penalty_counts.empty() ? 0 : r.penalty_counts[j];
      ++at;
    }
    p.penalty_end = at;
  }
  std::memcpy(host, params.data(), params.size() * sizeof(kc::SamplingRowParams));
  m.check(cudaMemcpyAsync(dev, host, params_bytes + 2 * tokens_bytes, cudaMemcpyHostToDevice, m.stream),
          "sampling upload");

  // min_tokens: a masked token's logit becomes a very negative finite value (every byte 0xFB: about
  // -2.6e36 in f32 and bf16, -65376 in fp16), which exp() turns into probability 0 in every dtype,
  // set in place before the kernel reads the row.
  const int64_t element_bytes = scalar_type_bytes(logits.type());
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const int32_t t : rows[i].masked_tokens) {
      TESSERA_CHECK(t >= 0 && t < vocab, "cuda sample: row " << i << " masks token " << t << ", outside the vocabulary");
      char* at = static_cast<char*>(const_cast<void*>(logits.data())) +
                 (static_cast<int64_t>(i) * vocab + t) * element_bytes;
      m.check(cudaMemsetAsync(at, 0xFB, static_cast<size_t>(element_bytes), m.stream), "sampling mask");
    }
  }

  const size_t need = kc::sampling_workspace_bytes(num_rows, vocab);
  if (need > m.sampling_workspace_bytes) {
    m.check(cudaStreamSynchronize(m.stream), "sampling workspace");
    if (m.sampling_workspace != nullptr) cudaFree(m.sampling_workspace);
    m.sampling_workspace_bytes = round_up(need * 2, kAlign);
    m.sampling_workspace = m.device_alloc(m.sampling_workspace_bytes, "the sampling workspace");
  }
  m.check_supported(kc::sampling_unsupported(num_rows, vocab, vocab, m.sampling_workspace_bytes), "sample");
  auto* out_dev = reinterpret_cast<kc::SampledRow*>(dev + params_bytes + 2 * tokens_bytes);
  m.check(kc::sample_rows(type, logits.data(), vocab, num_rows, vocab,
                          reinterpret_cast<const kc::SamplingRowParams*>(dev),
                          reinterpret_cast<const int32_t*>(dev + params_bytes),
                          reinterpret_cast<const int32_t*>(dev + params_bytes + tokens_bytes), m.sampling_workspace,
                          m.sampling_workspace_bytes, out_dev, m.stream),
          "sample", logits);
  auto* out_host = reinterpret_cast<kc::SampledRow*>(host + params_bytes + 2 * tokens_bytes);
  m.check(cudaMemcpyAsync(out_host, out_dev, rows.size() * sizeof(kc::SampledRow), cudaMemcpyDeviceToHost, m.stream),
          "sampling download");
  m.check(cudaStreamSynchronize(m.stream), "sample");
  std::vector<SampleOutcome> outcomes(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const kc::SampledRow& r = out_host[i];
    TESSERA_CHECK(r.token >= 0 && r.token < vocab, "cuda sample: row " << i << " sampled no token (NaN logits?)");
    outcomes[i].token = r.token;
    outcomes[i].logprob = r.logprob;
    for (int j = 0; j < std::min(rows[i].num_top_logprobs, kc::kMaxTopLogprobs); ++j) {
      outcomes[i].top.emplace_back(r.top_ids[j], r.top_logprobs[j]);
    }
  }
  return outcomes;
}

}  // namespace tessera
