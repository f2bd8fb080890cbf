// kernels/backend/cuda/cuda_ops.cpp: CudaBackend's ops. Each checks shapes and dtypes at the
// boundary, then enqueues kernels/cuda on the backend's stream; linears pick between the GEMV kernels
// and a GEMM (Impl::gemm), attention between the decode, prefill and generic kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/backend/cuda/cuda_backend_impl.h"
#include "kernels/cuda/activation/activation.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention_generic/attention_generic.h"
#include "kernels/cuda/embedding/embedding.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/quantized_weights.h"
#include "kernels/cuda/kv_cache/kv_cache.h"
#include "kernels/cuda/norm/norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/rows/rows.h"

namespace tessera {

using cuda_backend_detail::as_int;
using cuda_backend_detail::check_device;
using cuda_backend_detail::check_matrix;
using cuda_backend_detail::StepState;
using cuda_backend_detail::weight_format_of;

namespace {

// The kernels' arguments an attention call starts from, over every sequence of the step; attend
// fills in where the keys are. `q` is the first q row of the packed qkv.
kc::PrefillArgs prefill_args(const StepState& step, int32_t num_seqs, int32_t tokens, const QkvLayout& layout,
                             const void* q, Tensor& out, float scale) {
  kc::PrefillArgs prefill;
  prefill.out = out.data();
  prefill.q = q;
  prefill.cu_seqlens_q = step.cu_seqlens_q;
  prefill.cu_seqlens_k = step.cu_seqlens_k;
  prefill.masks = step.masks;
  prefill.num_seqs = num_seqs;
  prefill.total_q = tokens;
  prefill.max_seqlen_q = step.max_q_len;
  prefill.num_heads = layout.num_heads;
  prefill.num_kv_heads = layout.num_kv_heads;
  prefill.head_dim = layout.head_dim;
  prefill.q_row_stride = layout.row_width();
  prefill.out_row_stride = out.dim(1);
  prefill.softmax_scale = scale;
  return prefill;
}

// The generic kernel serves the shapes the fast kernels do not (head_dim 16, 48, ...; prompt rows at
// head_dim 80 and 96, whose decode rows the decode kernel takes).
kc::GenericAttentionArgs generic_args(const StepState& step, int32_t num_seqs, int tokens, const QkvLayout& layout,
                                      const void* q, Tensor& out, float scale) {
  kc::GenericAttentionArgs generic;
  generic.out = out.data();
  generic.q = q;
  generic.cu_seqlens_q = step.cu_seqlens_q;
  generic.masks = step.masks;
  generic.num_seqs = num_seqs;
  generic.total_q = tokens;
  generic.num_heads = layout.num_heads;
  generic.num_kv_heads = layout.num_kv_heads;
  generic.head_dim = layout.head_dim;
  generic.q_row_stride = layout.row_width();
  generic.out_row_stride = out.dim(1);
  generic.softmax_scale = scale;
  return generic;
}

// The decode kernel over the step's first `decode_rows` sequences (one query row each).
kc::DecodeArgs decode_args(const StepState& step, const QkvLayout& layout, int32_t block_size, const void* q,
                           Tensor& k_cache, Tensor& v_cache, Tensor& out, float scale) {
  kc::DecodeArgs decode;
  decode.out = out.data();
  decode.q = q;
  decode.k_cache = k_cache.data();
  decode.v_cache = v_cache.data();
  decode.block_tables = step.block_tables;
  decode.context_lens = step.kv_lens;
  decode.masks = step.masks;
  decode.num_seqs = step.decode_rows;
  decode.num_heads = layout.num_heads;
  decode.num_kv_heads = layout.num_kv_heads;
  decode.head_dim = layout.head_dim;
  decode.block_size = block_size;
  decode.max_blocks_per_seq = step.table_width;
  decode.max_context_len = step.decode_context;
  decode.step_keys = step.step_keys;
  decode.softmax_scale = scale;
  decode.q_row_stride = layout.row_width();
  decode.out_row_stride = out.dim(1);
  return decode;
}

}  // namespace

void CudaBackend::Impl::check_quantized_gemv(kc::WeightFormat format, const Tensor& x, const Tensor& w, int rows,
                                             int n, int k, const char* op) const {
  check_supported(kc::quantized_gemv_supported(format, rows, n, k, x.data(), w.data())
                      ? ""
                      : "quantized GEMV of " + w.describe() + " for " + x.describe() + " (16-byte alignment)",
                  op);
}

// y[rows, n] <- x · wᵀ (+ bias) for every weight and row count the GEMV kernels leave: the one
// place that picks the GEMM. Dense weights: cuBLASLt in the activation dtype. Quantized weights: a
// kernel that reads them as stored (quantized_gemm), with no bf16 copy of the weight, unless none
// takes the shape; then the weight is expanded to bf16 into the dense buffer for cuBLASLt.
void CudaBackend::Impl::gemm(const Tensor& x, const Tensor& w, const void* bias, void* y, int rows, int n, int k,
                             const char* op) {
  const void* weight = w.data();
  if (scalar_type_is_gpu_quantized(w.type())) {
    const kc::WeightFormat format = weight_format_of(w.type());
    if (quantized_gemm(format, x, w, bias, y, rows, n, k, op)) return;
    const size_t dense_bytes = static_cast<size_t>(w.numel()) * 2;
    if (dense_bytes > dense_weight_bytes) dense_weight_buffer(dense_bytes, w.name());
    check(kc::dequantize_weight(kdtype, w.data(), n, k, format, dense_weight, stream), "dequantize_weight", w);
    weight = dense_weight;
    ++dequantized_gemms;
  }
  const cudaError_t e = gemm_runner.run(kdtype, y, x.data(), weight, bias, rows, n, k, stream);
  if (e != cudaSuccess) check(e, std::string(op) + " " + w.describe() + " (" + gemm_runner.last_error() + ")");
}

// int8 and fp8_e4m3: the rows quantized to the weight's format and multiplied on the int8 or FP8
// tensor cores (twice bf16's rate). int4_g128: bf16 rows against nibbles expanded in registers.
bool CudaBackend::Impl::quantized_gemm(kc::WeightFormat format, const Tensor& x, const Tensor& w, const void* bias,
                                       void* y, int rows, int n, int k, const char* op) {
  cudaError_t e;
  if (format == kc::WeightFormat::kInt4G128) {
    e = gemm_runner.run_int4_g128(y, x.data(), w.data(), bias, rows, n, k, stream);
  } else {
    const size_t bytes = kc::quantized_weight_bytes(format, rows, k);
    void* xq = step_shared_buffer(&StepState::quantized_activations, &StepState::quantized_activations_bytes, bytes);
    check(kc::quantize_activations(kdtype, format, x.data(), rows, k, xq, stream), "quantize_activations", x);
    e = gemm_runner.run_w8a8(format, y, xq, kc::quantized_row_scales(format, xq, rows, k), w.data(),
                             kc::quantized_row_scales(format, w.data(), n, k), bias, rows, n, k, stream);
  }
  if (e == cudaSuccess) {
    ++quantized_gemms;
    return true;
  }
  if (e != cudaErrorNotSupported) check(e, std::string(op) + " " + w.describe() + " (" + gemm_runner.last_error() + ")");
  return false;
}

void CudaBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool accumulate) {
  Impl& gpu = *impl_;
  check_device(ids, "embedding");
  TESSERA_CHECK(ids.type() == ScalarType::kI32, "cuda embedding: ids " << ids.describe() << " must be i32");
  TESSERA_CHECK(table.shape().size() == 2, "cuda embedding: table " << table.describe() << " must be [vocab, dim]");
  check_matrix(table, "embedding", table.dim(1), gpu.config.dtype);
  check_matrix(out, "embedding", table.dim(1), gpu.config.dtype);
  TESSERA_CHECK(out.dim(0) == ids.numel(), "cuda embedding: " << out.describe() << " for " << ids.describe());
  const int tokens = as_int(ids.numel(), "tokens");
  const int hidden = as_int(table.dim(1), "hidden");
  const int vocab = as_int(table.dim(0), "vocab");
  gpu.check_supported(kc::embedding_unsupported(tokens, hidden, vocab), "embedding");
  gpu.check(kc::embedding_gather(gpu.kdtype, out.data(), table.data(), ids.i32(), tokens, hidden, vocab, gpu.stream,
                                 accumulate),
            "embedding", table);
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  Impl& gpu = *impl_;
  check_device(w, "linear");
  TESSERA_CHECK(w.shape().size() == 2, "cuda linear: weight " << w.describe() << " must be [out, in]");
  check_matrix(x, "linear", w.dim(1), gpu.config.dtype);
  check_matrix(y, "linear", w.dim(0), gpu.config.dtype);
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
    // stored; for more rows, Impl::gemm (W8A8 for int8 and fp8_e4m3, mixed-input for int4_g128).
    TESSERA_CHECK(gpu.kdtype == kc::DType::kBF16,
                  "cuda linear: quantized weight " << w.describe() << " needs bf16 activations");
    const kc::WeightFormat format = weight_format_of(w.type());
    if (rows <= kc::kGemvMaxM) {
      // Never the dequantize-then-GEMM path at these sizes: GemmRunner's GEMV kernel reads its weight
      // before the kernel ahead of it (the dequantization) has finished.
      gpu.check_quantized_gemv(format, x, w, rows, out_features, in_features, "linear");
      gpu.check(kc::quantized_gemv(gpu.kdtype, format, y.data(), x.data(), w.data(), bias ? bias->data() : nullptr,
                                   rows, out_features, in_features, gpu.step_row_bits, gpu.stream),
                "quantized_gemv", w);
      return;
    }
  } else {
    TESSERA_CHECK(w.type() == gpu.config.dtype, "cuda linear: weight " << w.describe() << " must be "
                                                                       << scalar_type_name(gpu.config.dtype)
                                                                       << " or a quantized format");
  }
  gpu.gemm(x, w, bias ? bias->data() : nullptr, y.data(), rows, out_features, in_features, "linear");
}

void CudaBackend::linear_silu_mul(const Tensor& x, const Tensor& w, Tensor& out) {
  Impl& gpu = *impl_;
  check_device(w, "linear_silu_mul");
  TESSERA_CHECK(w.shape().size() == 2 && w.dim(0) % 2 == 0,
                "cuda linear_silu_mul: weight " << w.describe() << " must be [2 * dim, in] (gate and up stacked)");
  check_matrix(x, "linear_silu_mul", w.dim(1), gpu.config.dtype);
  check_matrix(out, "linear_silu_mul", w.dim(0) / 2, gpu.config.dtype);
  TESSERA_CHECK(out.dim(0) == x.dim(0), "cuda linear_silu_mul: " << out.describe() << " for input " << x.describe());
  if (x.dim(0) == 0) return;
  const int rows = as_int(x.dim(0), "rows");
  const int n = as_int(w.dim(0), "out features");
  const int k = as_int(w.dim(1), "in features");
  gpu.check_supported(kc::activation_unsupported(rows, n / 2), "linear_silu_mul");
  // The product (columns alternating gate and up, as the weight's rows are stored: a W8A8 GEMM's
  // per-channel scales follow the same order), then silu_mul over the pairs. Its buffer is the
  // step's, reused by every layer (the stream orders them).
  auto via_product = [&](auto&& compute_product) {
    const size_t bytes = static_cast<size_t>(rows) * n * scalar_type_bytes(gpu.config.dtype);
    void* product = gpu.step_shared_buffer(&StepState::gate_up_product, &StepState::gate_up_product_bytes, bytes);
    compute_product(product);
    gpu.check(kc::silu_mul_pairs(gpu.kdtype, out.data(), product, rows, n / 2, gpu.stream), "silu_mul_pairs", out);
  };
  // Decode sizes: one GEMV whose epilogue applies silu(gate) · up (w is in pairs order, load_stacked),
  // where that measured faster than the plain GEMV then silu_mul.
  if (scalar_type_is_gpu_quantized(w.type())) {
    TESSERA_CHECK(gpu.kdtype == kc::DType::kBF16,
                  "cuda linear_silu_mul: quantized weight " << w.describe() << " needs bf16 activations");
    const kc::WeightFormat format = weight_format_of(w.type());
    if (rows <= kc::kGemvMaxM) {
      gpu.check_quantized_gemv(format, x, w, rows, n, k, "linear_silu_mul");
      // int8 on the tensor-core GEMV ran 8% slower on an H200 with the epilogue (7B shape, 8 rows), as
      // dense weights do below; fp8_e4m3 (13% faster there) and int4_g128 keep it.
      if (format == kc::WeightFormat::kInt8 && kc::quantized_gemv_takes_tensor_cores(format, rows, gpu.step_row_bits)) {
        via_product([&](void* product) {
          gpu.check(kc::quantized_gemv(gpu.kdtype, format, product, x.data(), w.data(), nullptr, rows, n, k,
                                       gpu.step_row_bits, gpu.stream),
                    "quantized_gemv", w);
        });
        return;
      }
      gpu.check(kc::quantized_gemv_silu_mul(gpu.kdtype, format, out.data(), x.data(), w.data(), rows, n, k,
                                            gpu.step_row_bits, gpu.stream),
                "quantized_gemv_silu_mul", w);
      return;
    }
  } else {
    TESSERA_CHECK(w.type() == gpu.config.dtype, "cuda linear_silu_mul: weight " << w.describe() << " must be "
                                                                                << scalar_type_name(gpu.config.dtype)
                                                                                << " or a quantized format");
    // Over dense weights the tensor-core GEMV ran 10% slower on the H100 with the SiLU epilogue than
    // as a plain GEMV then silu_mul: its rows take the path below.
    if (!kc::gemv_takes_tensor_cores(rows, gpu.step_row_bits) && kc::gemv_supported(rows, n, k, x.data(), w.data())) {
      gpu.check(kc::gemv_silu_mul(gpu.kdtype, out.data(), x.data(), w.data(), rows, n, k, gpu.step_row_bits,
                                  gpu.stream),
                "gemv_silu_mul", w);
      return;
    }
  }
  // Prefill sizes, and dense weights on the tensor-core GEMV (as above).
  via_product([&](void* product) { gpu.gemm(x, w, nullptr, product, rows, n, k, "linear_silu_mul"); });
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  Impl& gpu = *impl_;
  check_matrix(x, "rms_norm", w.numel(), gpu.config.dtype);
  check_matrix(out, "rms_norm", w.numel(), gpu.config.dtype);
  TESSERA_CHECK(out.dim(0) == x.dim(0), "cuda rms_norm: " << out.describe() << " for " << x.describe());
  const int tokens = as_int(x.dim(0), "tokens");
  const int hidden = as_int(x.dim(1), "hidden");
  gpu.check_supported(kc::norm_unsupported(tokens, hidden, hidden, hidden), "rms_norm");
  gpu.check(kc::rmsnorm(gpu.kdtype, out.data(), x.data(), w.data(), tokens, hidden, hidden, hidden, eps, gpu.stream),
            "rms_norm", x);
}

void CudaBackend::add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  Impl& gpu = *impl_;
  check_matrix(x, "add_rms_norm", w.numel(), gpu.config.dtype);
  check_matrix(residual, "add_rms_norm", w.numel(), gpu.config.dtype);
  TESSERA_CHECK(residual.dim(0) == x.dim(0), "cuda add_rms_norm: " << residual.describe() << " for " << x.describe());
  const int tokens = as_int(x.dim(0), "tokens");
  const int hidden = as_int(x.dim(1), "hidden");
  gpu.check_supported(kc::norm_unsupported(tokens, hidden, hidden, hidden), "add_rms_norm");
  gpu.check(
      kc::fused_add_rmsnorm(gpu.kdtype, x.data(), residual.data(), w.data(), tokens, hidden, hidden, eps, gpu.stream),
      "add_rms_norm", x);
}

void CudaBackend::layer_norm(Tensor& x, const Tensor* residual, const Tensor& w, const Tensor& b, float eps) {
  Impl& gpu = *impl_;
  check_matrix(x, "layer_norm", w.numel(), gpu.config.dtype);
  TESSERA_CHECK(b.numel() == w.numel(), "cuda layer_norm: bias " << b.describe() << " for " << w.describe());
  if (residual != nullptr) {
    check_matrix(*residual, "layer_norm", w.numel(), gpu.config.dtype);
    TESSERA_CHECK(residual->dim(0) == x.dim(0), "cuda layer_norm: " << residual->describe() << " for " << x.describe());
  }
  const int tokens = as_int(x.dim(0), "tokens");
  const int hidden = as_int(x.dim(1), "hidden");
  gpu.check_supported(kc::norm_unsupported(tokens, hidden, hidden, hidden), "layer_norm");
  gpu.check(kc::layernorm(gpu.kdtype, x.data(), x.data(), residual ? residual->data() : nullptr, w.data(), b.data(),
                          tokens, hidden, eps, gpu.stream),
            "layer_norm", x);
}

void CudaBackend::copy_kv_rows(KvCacheStorage& cache, std::span<const int32_t> src_slots,
                               std::span<const int32_t> dst_slots, std::span<const int32_t> rotate_by,
                               const Tensor& inv_freq) {
  Impl& gpu = *impl_;
  gpu.enter();
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
  for (std::span<const int32_t> part : {src_slots, dst_slots, rotate_by})
    packed.insert(packed.end(), part.begin(), part.end());
  for (int r = 0; r < rows; ++r) {
    TESSERA_CHECK(packed[r] >= 0 && packed[r] < num_slots && packed[rows + r] >= 0 && packed[rows + r] < num_slots,
                  "cuda copy_kv_rows: slot " << packed[r] << " -> " << packed[rows + r] << " outside " << num_slots);
  }
  if (!gpu.kv_copy_indices.defined() || gpu.kv_copy_indices.numel() < static_cast<int64_t>(packed.size())) {
    gpu.kv_copy_indices =
        gpu.allocate_tensor({static_cast<int64_t>(packed.size())}, ScalarType::kI32, "kv_copy_indices", true);
  }
  // From pageable memory the copy is staged before it returns, so `packed` may go out of scope.
  gpu.check(
      cudaMemcpyAsync(gpu.kv_copy_indices.data(), packed.data(), packed.size() * 4, cudaMemcpyHostToDevice, gpu.stream),
      "copy_kv_rows indices");
  gpu.check_supported(
      kc::kv_cache_copy_rotate_unsupported(gpu.kdtype, rows, cache.num_kv_heads, cache.head_dim, gpu.kv_kdtype),
      "copy_kv_rows");
  const int32_t* indices = static_cast<const int32_t*>(gpu.kv_copy_indices.data());
  for (int64_t layer = 0; layer < cache.num_layers(); ++layer) {
    gpu.check_kv_tensor(cache.k[layer], "copy_kv_rows");
    gpu.check(kc::kv_cache_copy_rotate(gpu.kdtype, cache.k[layer].data(), cache.v[layer].data(), indices,
                                       indices + rows, indices + 2 * rows, rows, cache.num_kv_heads, cache.head_dim,
                                       inv_freq.f32(), gpu.stream, gpu.kv_kdtype),
              "copy_kv_rows", cache.k[layer]);
  }
}

void CudaBackend::rope(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, const AttentionPlan& plan) {
  Impl& gpu = *impl_;
  check_matrix(qkv, "rope", layout.row_width(), gpu.config.dtype);
  TESSERA_CHECK(qkv.dim(0) == plan.total_q(),
                "cuda rope: " << qkv.describe() << " for a plan of " << plan.total_q() << " tokens");
  check_device(inv_freq, "rope");
  TESSERA_CHECK(inv_freq.type() == ScalarType::kF32 && inv_freq.numel() == layout.head_dim / 2,
                "cuda rope: " << inv_freq.describe() << " must be f32[" << layout.head_dim / 2 << "]");
  const StepState& step = gpu.step_state(plan, "rope");
  const int tokens = as_int(qkv.dim(0), "tokens");
  const int64_t stride = layout.row_width();
  gpu.check_supported(
      kc::rope_unsupported(tokens, layout.num_heads, layout.num_kv_heads, layout.head_dim, stride, stride), "rope");
  char* base = static_cast<char*>(qkv.data());
  const int64_t element_bytes = scalar_type_bytes(gpu.config.dtype);
  gpu.check(kc::rope_inplace(gpu.kdtype, base + layout.q_offset() * element_bytes,
                             base + layout.k_offset() * element_bytes, step.positions, tokens, layout.num_heads,
                             layout.num_kv_heads, layout.head_dim, stride, stride, inv_freq.f32(), gpu.stream),
            "rope", qkv);
}

void CudaBackend::attention(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                            KvCacheStorage* cache, int64_t layer, Tensor& out) {
  attend(qkv, layout, scale, plan, cache, layer, out, nullptr);
}

void CudaBackend::rope_attention(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, float scale,
                                 const AttentionPlan& plan, KvCacheStorage* cache, int64_t layer, Tensor& out) {
  // Without a cache to write, attention reads the packed k, rotated in place. The fused kernel, a block
  // per (token, head), pays only where every row decodes: it made a 512-token prefill of the 7B
  // shape 3-8% slower on the H100 than rope then the append. Both give the same bits.
  if (!plan.paged() || impl_->step_state(plan, "rope_attention").max_q_len > 1) {
    rope(qkv, layout, inv_freq, plan);
    attend(qkv, layout, scale, plan, cache, layer, out, nullptr);
    return;
  }
  check_device(inv_freq, "rope_attention");
  TESSERA_CHECK(inv_freq.type() == ScalarType::kF32 && inv_freq.numel() == layout.head_dim / 2,
                "cuda rope_attention: " << inv_freq.describe() << " must be f32[" << layout.head_dim / 2 << "]");
  attend(qkv, layout, scale, plan, cache, layer, out, &inv_freq);
}

// The generic kernel takes every shape a fast kernel does, so it is the shape test (with no rows,
// nothing but the shape is checked).
std::string CudaBackend::attention_unsupported(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim) const {
  kc::GenericAttentionArgs shape;
  shape.num_heads = num_heads;
  shape.num_kv_heads = num_kv_heads;
  shape.head_dim = head_dim;
  shape.q_row_stride = shape.out_row_stride = static_cast<int64_t>(num_heads) * head_dim;
  shape.softmax_scale = 1.0f;
  return kc::generic_attention_unsupported(impl_->kdtype, shape);
}

void CudaBackend::attend(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                         KvCacheStorage* cache, int64_t layer, Tensor& out, const Tensor* rope_inv_freq) {
  Impl& gpu = *impl_;
  check_matrix(qkv, "attention", layout.row_width(), gpu.config.dtype);
  check_matrix(out, "attention", static_cast<int64_t>(layout.num_heads) * layout.head_dim, gpu.config.dtype);
  TESSERA_CHECK(qkv.dim(0) == plan.total_q() && out.dim(0) == plan.total_q(),
                "cuda attention: " << qkv.describe() << " -> " << out.describe() << " for a plan of " << plan.total_q()
                                   << " tokens");
  StepState& step = gpu.step_state(plan, "attention");
  const int64_t element_bytes = scalar_type_bytes(gpu.config.dtype);
  const char* base = static_cast<const char*>(qkv.data());
  const void* q = base + layout.q_offset() * element_bytes;
  const int tokens = as_int(plan.total_q(), "tokens");
  kc::PrefillArgs prefill = prefill_args(step, plan.num_seqs(), tokens, layout, q, out, scale);
  prefill.tile_counters = gpu.prefill_tile_counters;
  prefill.num_sms = gpu.num_sms;
  const kc::GenericAttentionArgs generic = generic_args(step, plan.num_seqs(), tokens, layout, q, out, scale);
  if (!plan.paged()) {
    TESSERA_CHECK(cache == nullptr, "cuda attention: a KV cache was given but the plan has none");
    gpu.attend_packed(prefill, generic, base + layout.k_offset() * element_bytes,
                      base + layout.v_offset() * element_bytes, layout.row_width(), qkv, step);
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
  gpu.check_kv_tensor(cache->k[layer], "attention");
  gpu.check_kv_tensor(cache->v[layer], "attention");
  gpu.append_kv(*cache, layer, layout, qkv, step, rope_inv_freq);
  kc::DecodeArgs decode = decode_args(step, layout, cache->block_size, q, cache->k[layer], cache->v[layer], out, scale);
  gpu.attend_paged(prefill, generic, decode, *cache, layer, layout, qkv, step);
}

void CudaBackend::Impl::attend_packed(kc::PrefillArgs prefill, kc::GenericAttentionArgs generic, const void* k,
                                      const void* v, int64_t stride, const Tensor& qkv, const StepState& step) {
  prefill.k = k;
  prefill.v = v;
  prefill.k_row_stride = stride;
  prefill.v_row_stride = stride;
  prefill.total_k = prefill.total_q;  // K and V are columns of the same packed rows
  if (kc::prefill_unsupported(kdtype, prefill).empty()) {
    check(kc::prefill_attention(kdtype, prefill, stream), "attention (prefill)", qkv);
    return;
  }
  generic.k = k;
  generic.v = v;
  generic.k_row_stride = stride;
  generic.v_row_stride = stride;
  generic.cu_seqlens_k = step.cu_seqlens_k;
  check_supported(kc::generic_attention_unsupported(kdtype, generic), "attention");
  check(kc::generic_attention(kdtype, generic, stream), "attention (generic)", qkv);
}

void CudaBackend::Impl::append_kv(KvCacheStorage& cache, int64_t layer, const QkvLayout& layout, const Tensor& qkv,
                                  const StepState& step, const Tensor* rope_inv_freq) {
  const int64_t element_bytes = scalar_type_bytes(config.dtype);
  char* base = static_cast<char*>(const_cast<void*>(qkv.data()));
  void* q = base + layout.q_offset() * element_bytes;
  const void* k = base + layout.k_offset() * element_bytes;
  const void* v = base + layout.v_offset() * element_bytes;
  const int64_t stride = layout.row_width();
  const int tokens = as_int(qkv.dim(0), "tokens");
  Tensor& k_cache = cache.k[layer];
  Tensor& v_cache = cache.v[layer];
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  if (rope_inv_freq != nullptr) {
    // rope_attention: q rotated in place and K rotated into the cache by one kernel. Only
    // rope_attention passes rope_inv_freq, and its qkv is mutable.
    check_supported(kc::kv_cache_append_rope_unsupported(kdtype, tokens, layout.num_heads, layout.num_kv_heads,
                                                         layout.head_dim, stride, stride, stride, num_slots, kv_kdtype),
                    "rope_attention");
    check(kc::kv_cache_append_rope(kdtype, k_cache.data(), v_cache.data(), q, stride, k, stride, v, stride,
                                   step.positions, step.slot_mapping, tokens, layout.num_heads, layout.num_kv_heads,
                                   layout.head_dim, num_slots, rope_inv_freq->f32(), stream, kv_kdtype),
          "kv_cache_append_rope", k_cache);
    return;
  }
  check_supported(kc::kv_cache_append_unsupported(kdtype, tokens, layout.num_kv_heads, layout.head_dim, stride, stride,
                                                  num_slots, kv_kdtype),
                  "kv_cache_append");
  check(kc::kv_cache_append(kdtype, k_cache.data(), v_cache.data(), k, stride, v, stride, step.slot_mapping, tokens,
                            layout.num_kv_heads, layout.head_dim, num_slots, stream, kv_kdtype),
        "kv_cache_append", k_cache);
}

void CudaBackend::Impl::attend_paged(kc::PrefillArgs prefill, kc::GenericAttentionArgs generic, kc::DecodeArgs decode,
                                     KvCacheStorage& cache, int64_t layer, const QkvLayout& layout, const Tensor& qkv,
                                     StepState& step) {
  Tensor& k_cache = cache.k[layer];
  Tensor& v_cache = cache.v[layer];
  decode.min_split_tokens = config.decode_split_min_tokens;
  decode.split_as_one_sequence = cuda_backend_detail::invariant_rows(config, &step) && decode.num_seqs <= kc::kGemvMaxM;
  decode.kv_dtype = kv_kdtype;
  const bool decode_fast = step.decode_rows > 0 && kc::decode_unsupported(kdtype, decode).empty();
  auto run_decode = [&] {
    check(kc::decode_attention(kdtype, decode, decode_workspace_for(decode), num_sms, stream), "attention (decode)",
          qkv);
  };
  if (step.max_q_len == 1 && decode_fast) {
    run_decode();
    return;
  }
  // Prefill, chunked prefill and mixed steps: the fast prefill kernel reads each sequence's keys
  // contiguously, so the paged K/V of the step's prompt chunks is gathered once per layer into one
  // workspace slice. A mixed step's leading decode rows need no gather: the decode kernel reads
  // their keys in place.
  const int64_t kv_width = static_cast<int64_t>(layout.num_kv_heads) * layout.head_dim;
  prefill.k_row_stride = kv_width;
  prefill.v_row_stride = kv_width;
  if (kc::prefill_unsupported(kdtype, prefill).empty()) {
    const int32_t first = decode_fast ? step.decode_rows : 0;
    const int32_t seqs = prefill.num_seqs - first;
    const int32_t total_k = decode_fast ? step.tail_total_k : step.total_k;
    const int32_t* cu_k = decode_fast ? step.cu_seqlens_k_tail : step.cu_seqlens_k;
    const int32_t* tables = step.block_tables + static_cast<ptrdiff_t>(first) * step.table_width;
    if (step.gathered_k == nullptr) {
      const size_t bytes = static_cast<size_t>(total_k) * kv_width * scalar_type_bytes(config.dtype);
      step.gathered_k = workspace_slice(bytes);
      step.gathered_v = workspace_slice(bytes);
    }
    check_supported(kc::kv_cache_gather_unsupported(kdtype, step.table_width, seqs, total_k, cache.block_size,
                                                    layout.num_kv_heads, layout.head_dim, cache.num_blocks, kv_kdtype),
                    "kv_cache_gather");
    // Gathered rows are in the activation dtype (an e4m3 cache is widened here), so the prefill
    // kernel reads them as it reads any K/V.
    check(kc::kv_cache_gather(kdtype, step.gathered_k, step.gathered_v, k_cache.data(), v_cache.data(), tables,
                              step.table_width, cu_k, seqs, total_k, cache.block_size, layout.num_kv_heads,
                              layout.head_dim, cache.num_blocks, stream, kv_kdtype),
          "kv_cache_gather", k_cache);
    if (decode_fast) run_decode();
    prefill.k = step.gathered_k;
    prefill.v = step.gathered_v;
    prefill.total_k = total_k;
    prefill.cu_seqlens_q = step.cu_seqlens_q + first;
    prefill.cu_seqlens_k = cu_k;
    prefill.masks = step.masks + first;
    prefill.num_seqs = seqs;
    check(kc::prefill_attention(kdtype, prefill, stream), "attention (prefill)", qkv);
    return;
  }
  generic.k = k_cache.data();
  generic.v = v_cache.data();
  generic.block_tables = step.block_tables;
  generic.max_blocks_per_seq = step.table_width;
  generic.block_size = cache.block_size;
  generic.kv_lens = step.kv_lens;
  generic.kv_dtype = kv_kdtype;
  check_supported(kc::generic_attention_unsupported(kdtype, generic), "attention");
  check(kc::generic_attention(kdtype, generic, stream), "attention (generic)", qkv);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  Impl& gpu = *impl_;
  check_device(out, "silu_mul");
  TESSERA_CHECK(out.shape().size() == 2, "cuda silu_mul: " << out.describe() << " must be [rows, dim]");
  check_matrix(out, "silu_mul", out.dim(1), gpu.config.dtype);
  check_matrix(gate_up, "silu_mul", 2 * out.dim(1), gpu.config.dtype);
  TESSERA_CHECK(gate_up.dim(0) == out.dim(0), "cuda silu_mul: " << out.describe() << " for " << gate_up.describe());
  const int tokens = as_int(out.dim(0), "tokens");
  const int inter = as_int(out.dim(1), "width");
  gpu.check_supported(kc::activation_unsupported(tokens, inter), "silu_mul");
  gpu.check(kc::silu_mul(gpu.kdtype, out.data(), gate_up.data(), tokens, inter, gpu.stream), "silu_mul", out);
}

void CudaBackend::add(const Tensor& x, Tensor& residual) {
  Impl& gpu = *impl_;
  TESSERA_CHECK(x.shape().size() == 2 && x.shape() == residual.shape(),
                "cuda add: " << x.describe() << " and " << residual.describe() << " must be one [rows, dim] shape");
  check_matrix(x, "add", x.dim(1), gpu.config.dtype);
  check_matrix(residual, "add", x.dim(1), gpu.config.dtype);
  const int tokens = as_int(x.dim(0), "tokens");
  const int width = as_int(x.dim(1), "width");
  gpu.check_supported(kc::activation_unsupported(tokens, width), "add");
  gpu.check(kc::add_residual(gpu.kdtype, residual.data(), x.data(), tokens, width, gpu.stream), "add", residual);
}

void CudaBackend::concat_columns(std::span<const Tensor* const> parts, Tensor& out) {
  Impl& gpu = *impl_;
  TESSERA_CHECK(!parts.empty(), "cuda concat_columns: no parts for " << out.describe());
  TESSERA_CHECK(out.shape().size() == 2, "cuda concat_columns: " << out.describe() << " must be [rows, cols]");
  check_matrix(out, "concat_columns", out.dim(1), gpu.config.dtype);
  int64_t cols = 0;
  for (const Tensor* part : parts) {
    TESSERA_CHECK(
        part->shape().size() == 2 && part->dim(0) == out.dim(0),
        "cuda concat_columns: " << part->describe() << " is not [" << out.dim(0) << ", cols] like " << out.describe());
    check_matrix(*part, "concat_columns", part->dim(1), gpu.config.dtype);
    cols += part->dim(1);
  }
  TESSERA_CHECK(cols == out.dim(1), "cuda concat_columns: parts have " << cols << " columns, " << out.describe());
  if (out.dim(0) == 0) return;
  const size_t element = scalar_type_bytes(gpu.config.dtype);
  const size_t out_pitch = static_cast<size_t>(out.dim(1)) * element;
  size_t offset = 0;
  for (const Tensor* part : parts) {
    const size_t width = static_cast<size_t>(part->dim(1)) * element;
    if (width != 0) {
      gpu.check(cudaMemcpy2DAsync(static_cast<char*>(out.data()) + offset, out_pitch, part->data(), width, width,
                                  static_cast<size_t>(out.dim(0)), cudaMemcpyDeviceToDevice, gpu.stream),
                "concat_columns", out);
    }
    offset += width;
  }
}

void CudaBackend::gelu(Tensor& x) {
  Impl& gpu = *impl_;
  check_device(x, "gelu");
  TESSERA_CHECK(x.shape().size() == 2, "cuda gelu: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "gelu", x.dim(1), gpu.config.dtype);
  const int tokens = as_int(x.dim(0), "tokens");
  const int width = as_int(x.dim(1), "width");
  gpu.check_supported(kc::activation_unsupported(tokens, width), "gelu");
  gpu.check(kc::bias_gelu(gpu.kdtype, x.data(), nullptr, tokens, width, gpu.stream), "gelu", x);
}

void CudaBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  Impl& gpu = *impl_;
  check_device(x, "gather_rows");
  TESSERA_CHECK(x.shape().size() == 2, "cuda gather_rows: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "gather_rows", x.dim(1), gpu.config.dtype);
  check_matrix(out, "gather_rows", x.dim(1), gpu.config.dtype);
  TESSERA_CHECK(out.dim(0) == static_cast<int64_t>(rows.size()),
                "cuda gather_rows: " << out.describe() << " for " << rows.size() << " rows");
  for (size_t i = 0; i < rows.size(); ++i) {
    TESSERA_CHECK(rows[i] >= 0 && rows[i] < x.dim(0), "cuda gather_rows: row " << rows[i] << " of " << x.describe());
  }
  if (rows.empty()) return;
  // The usual rows (each sequence's last token) went up with the step's plan; any others go up now.
  const int32_t* device_rows = nullptr;
  Tensor uploaded;
  if (gpu.current_step != nullptr && std::ranges::equal(rows, gpu.current_step->host_last_rows)) {
    device_rows = gpu.current_step->last_rows;
  } else {
    uploaded = upload(rows, {static_cast<int64_t>(rows.size())}, "gather_rows.rows");
    device_rows = uploaded.i32();
  }
  const int width = as_int(x.dim(1), "width");
  gpu.check_supported(kc::rows_unsupported(gpu.kdtype, static_cast<int>(rows.size()), width), "gather_rows");
  gpu.check(
      kc::gather_rows(gpu.kdtype, out.data(), x.data(), device_rows, static_cast<int>(rows.size()), width, gpu.stream),
      "gather_rows", x);
}

void CudaBackend::pool(const Tensor& x, const AttentionPlan& plan, PoolMode mode, Tensor& out) {
  Impl& gpu = *impl_;
  check_device(x, "pool");
  TESSERA_CHECK(x.shape().size() == 2 && x.dim(0) == plan.total_q(),
                "cuda pool: " << x.describe() << " for a plan of " << plan.total_q() << " tokens");
  check_matrix(x, "pool", x.dim(1), gpu.config.dtype);
  check_matrix(out, "pool", x.dim(1), gpu.config.dtype);
  TESSERA_CHECK(out.dim(0) == plan.num_seqs(),
                "cuda pool: " << out.describe() << " for " << plan.num_seqs() << " sequences");
  const StepState& step = gpu.step_state(plan, "pool");
  const int width = as_int(x.dim(1), "width");
  const kc::PoolKind kind = mode == PoolMode::kMean ? kc::PoolKind::kMean : kc::PoolKind::kFirst;
  gpu.check_supported(kc::pool_rows_unsupported(gpu.kdtype, plan.num_seqs(), width, kind), "pool");
  gpu.check(
      kc::pool_rows(gpu.kdtype, out.data(), x.data(), step.cu_seqlens_q, plan.num_seqs(), width, kind, gpu.stream),
      "pool", x);
}

void CudaBackend::l2_normalize(Tensor& x) {
  Impl& gpu = *impl_;
  check_device(x, "l2_normalize");
  TESSERA_CHECK(x.shape().size() == 2, "cuda l2_normalize: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "l2_normalize", x.dim(1), gpu.config.dtype);
  const int rows = as_int(x.dim(0), "rows");
  const int width = as_int(x.dim(1), "width");
  gpu.check_supported(kc::rows_unsupported(gpu.kdtype, rows, width), "l2_normalize");
  gpu.check(kc::l2_normalize_rows(gpu.kdtype, x.data(), rows, width, 1e-12f, gpu.stream), "l2_normalize", x);
}

void CudaBackend::softmax(Tensor& x) {
  Impl& gpu = *impl_;
  check_device(x, "softmax");
  TESSERA_CHECK(x.shape().size() == 2, "cuda softmax: " << x.describe() << " must be [rows, dim]");
  check_matrix(x, "softmax", x.dim(1), gpu.config.dtype);
  const int rows = as_int(x.dim(0), "rows");
  const int width = as_int(x.dim(1), "width");
  gpu.check_supported(kc::rows_unsupported(gpu.kdtype, rows, width), "softmax");
  gpu.check(kc::softmax_rows(gpu.kdtype, x.data(), rows, width, gpu.stream), "softmax", x);
}

}  // namespace tessera
