// kernels/cpu/quant/matmul.cpp: the format and ISA dispatch of linear layers, and the row split
// over threads (see matmul.h).
#include "kernels/cpu/quant/matmul.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant/kernel_table.h"
#include "kernels/cpu/thread_pool.h"

namespace tessera::kernels::cpu {
namespace {

namespace qd = quant_detail;

// The engine thread owns its buffer; pool workers only read it during a call.
thread_local Q8Buffer activation_rows;

// Below this many multiply-adds the calling thread does the whole product: a 576 x 576 decode
// projection (331k) is ~10 us of work, where a hand-off to another thread costs a few us.
constexpr int64_t kParallelMinMacs = 1 << 17;
// Rows per task are a multiple of the kernels' widest weight tile (4 rows), so no task ends in the
// slower single-row tail except the last.
constexpr int64_t kRowAlign = 4;
// Quantizing activations is split over threads only for prefill-sized inputs.
constexpr int64_t kParallelQuantizeMin = 1 << 16;
// fp16 / bf16 weights with at least this many activation rows go through OpenBLAS on fp32 tiles of
// kWidenTileRows weight rows (the register kernels re-read the weights once per 4 activation rows).
constexpr int64_t kWidenMinRows = 8;
constexpr int64_t kWidenTileRows = 64;

const qd::KernelTable& table_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return qd::avx512vnni_kernels();
    case Isa::kAvx2: return qd::avx2_kernels();
    case Isa::kScalar: break;
  }
  return qd::scalar_kernels();
}

// body(j0, j1) over output rows [0, n), on the pool when the product is big enough; each task's
// rows start at a multiple of `align`.
template <typename Body>
void split_rows(int64_t n, int64_t macs, int64_t align, const Body& body) {
  if (macs < kParallelMinMacs || num_threads() == 1) {
    body(0, n);
    return;
  }
  const int64_t groups = (n + align - 1) / align;
  parallel_for(groups, 1, [&](int64_t g0, int64_t g1) { body(g0 * align, std::min(n, g1 * align)); });
}

void add_bias(const float* bias, float* y, int64_t m, int64_t n, int64_t j0, int64_t j1) {
  if (bias == nullptr) return;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = j0; j < j1; ++j) y[r * n + j] += bias[j];
  }
}

Status quantized_linear(const qd::KernelTable& kernels, WeightFormat format, const std::byte* w, const float* x,
                        const float* bias, float* y, int64_t m, int64_t n, int64_t k, ActivationBits bits) {
  qd::QuantMatmulFn matmul = nullptr;
  switch (format) {
    case WeightFormat::kQ8_0: matmul = kernels.q8_0; break;
    case WeightFormat::kQ4_0: matmul = kernels.q4_0; break;
    case WeightFormat::kQ4_1: matmul = kernels.q4_1; break;
    case WeightFormat::kQ8_0x8: matmul = kernels.q8_0x8; break;
    case WeightFormat::kQ4_0x8: matmul = kernels.q4_0x8; break;
    case WeightFormat::kQ4_1x8: matmul = kernels.q4_1x8; break;
    default: return Status::kUnsupported;
  }
  // Interleaved weights come in whole groups of 8 rows, and tasks split them at group edges.
  const bool interleaved = is_interleaved_format(format);
  if (interleaved && n % kInterleaveRows != 0) return Status::kInvalidShape;
  Q8Rows& q = activation_rows.reserve(m, k, bits);
  if (m * k >= kParallelQuantizeMin) {
    parallel_for(m, 1, [&](int64_t r0, int64_t r1) { kernels.quantize_rows(x, r0, r1, q); });
  } else {
    kernels.quantize_rows(x, 0, m, q);
  }
  const size_t row_bytes = weight_row_bytes(format, k);
  split_rows(n, m * n * k, interleaved ? kInterleaveRows : kRowAlign, [&](int64_t j0, int64_t j1) {
    matmul(q, w, row_bytes, j0, j1, y, n);
    add_bias(bias, y, m, n, j0, j1);
  });
  return Status::kOk;
}

Status float16_linear(const qd::KernelTable& kernels, WeightFormat format, const std::byte* w, const float* x,
                      const float* bias, float* y, int64_t m, int64_t n, int64_t k) {
  const bool bf16 = format == WeightFormat::kBF16;
  const size_t row_bytes = weight_row_bytes(format, k);
  if (m < kWidenMinRows) {
    const qd::FloatMatmulFn matmul = bf16 ? kernels.bf16 : kernels.f16;
    split_rows(n, m * n * k, kRowAlign, [&](int64_t j0, int64_t j1) {
      matmul(x, m, k, w, row_bytes, j0, j1, y, n);
      add_bias(bias, y, m, n, j0, j1);
    });
    return Status::kOk;
  }
  const qd::WidenFn widen = bf16 ? kernels.widen_bf16 : kernels.widen_f16;
  split_rows(n, m * n * k, kRowAlign, [&](int64_t j0, int64_t j1) {
    thread_local std::vector<float> tile;  // one tile per thread, reused: never a whole fp32 copy
    tile.resize(static_cast<size_t>(kWidenTileRows * k));
    for (int64_t j = j0; j < j1; j += kWidenTileRows) {
      const int64_t rows = std::min(kWidenTileRows, j1 - j);
      widen(w + j * row_bytes, rows * k, tile.data());
      blas::sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(rows),
                  static_cast<int>(k), 1.0f, x, static_cast<int>(k), tile.data(), static_cast<int>(k), 0.0f, y + j,
                  static_cast<int>(n));
    }
    add_bias(bias, y, m, n, j0, j1);
  });
  return Status::kOk;
}

}  // namespace

void release_activation_rows() { activation_rows = Q8Buffer(); }

Status linear_on(Isa isa, WeightFormat format, const void* w, const float* x, const float* bias, float* y, int64_t m,
                 int64_t n, int64_t k, ActivationBits activation_bits) {
  if (m <= 0 || n <= 0 || k <= 0) return Status::kInvalidShape;
  if (activation_bits != ActivationBits::k8 && activation_bits != ActivationBits::k16) return Status::kInvalidArgument;
  if (w == nullptr || x == nullptr || y == nullptr) return Status::kInvalidArgument;
  if (weight_row_bytes(format, k) == 0) return Status::kInvalidShape;  // a block format needs k % 32 == 0
  if (!isa_supported(isa)) return Status::kUnsupported;
  if (format == WeightFormat::kF32) return gemm_xwt(x, static_cast<const float*>(w), bias, y, m, n, k);
  const qd::KernelTable& kernels = table_for(isa);
  const auto* bytes = static_cast<const std::byte*>(w);
  if (is_block_format(format)) return quantized_linear(kernels, format, bytes, x, bias, y, m, n, k, activation_bits);
  return float16_linear(kernels, format, bytes, x, bias, y, m, n, k);
}

Status linear(WeightFormat format, const void* w, const float* x, const float* bias, float* y, int64_t m, int64_t n,
              int64_t k, ActivationBits activation_bits) {
  return linear_on(best_isa(), format, w, x, bias, y, m, n, k, activation_bits);
}

Status embedding_gather_rows(WeightFormat format, const int32_t* ids, const void* table, float* out, int64_t count,
                             int64_t vocab, int64_t dim, bool accumulate) {
  if (count < 0 || vocab <= 0 || dim <= 0) return Status::kInvalidShape;
  if (weight_row_bytes(format, dim) == 0) return Status::kInvalidShape;
  if (is_interleaved_format(format) && vocab % kInterleaveRows != 0) return Status::kInvalidShape;
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) return Status::kInvalidArgument;
  }
  const auto* base = static_cast<const std::byte*>(table);
  std::vector<float> row(accumulate ? static_cast<size_t>(dim) : 0);
  for (int64_t i = 0; i < count; ++i) {
    float* dst = out + i * dim;
    if (!accumulate) {
      dequantize_row(format, base, ids[i], dim, dst);
      continue;
    }
    dequantize_row(format, base, ids[i], dim, row.data());
    for (int64_t j = 0; j < dim; ++j) dst[j] += row[j];
  }
  return Status::kOk;
}

}  // namespace tessera::kernels::cpu
