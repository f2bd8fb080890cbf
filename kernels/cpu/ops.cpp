// kernels/cpu/ops.cpp: fp32 reference kernels (see ops.h). Accumulation in fp32 except where a
// wider sum is cheaper than the error it avoids (norm statistics use double).
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

#include "kernels/cpu/blas.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

namespace tessera::kernels::cpu {

namespace {
// Rows per task are chosen so one task touches at least this many elements: smaller tasks cost
// more in hand-off than they gain.
constexpr int64_t kRowGrainElements = 16384;
}  // namespace

void configure_threads(int threads) {
  set_num_threads(threads);  // BLAS runs single-threaded inside our tasks (blas.cpp)
}

namespace {
// Columns per thread are rounded to this so each slice starts on a cache line of y and w rows stay
// whole blocks for OpenBLAS's packing.
constexpr int64_t kGemmColumnAlign = 16;
// Below this many multiply-adds a single thread is faster than waking the others.
constexpr int64_t kGemmParallelMin = 1 << 16;
}  // namespace

Status gemm_xwt(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
                int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return Status::kInvalidShape;
  if (x == nullptr || w == nullptr || y == nullptr) return Status::kInvalidArgument;
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) std::memcpy(y + i * n, bias, sizeof(float) * n);
    beta = 1.0f;
  }
  const int64_t threads = m * n * k >= kGemmParallelMin ? num_threads() : 1;
  const int64_t per_thread = ((n + threads - 1) / threads + kGemmColumnAlign - 1) / kGemmColumnAlign * kGemmColumnAlign;
  const int64_t slices = (n + per_thread - 1) / per_thread;
  // One column slice per task (grain 1 over slices): each runs a single-threaded OpenBLAS call.
  parallel_for(slices, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const int64_t col0 = s * per_thread;
      const int64_t cols = std::min(per_thread, n - col0);
      const float* w_slice = w + col0 * k;
      if (m == 1) {
        // A single row is a matrix-vector product; gemv avoids sgemm's packing.
        blas::sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(cols), static_cast<int>(k), 1.0f, w_slice,
                    static_cast<int>(k), x, 1, beta, y + col0, 1);
      } else {
        blas::sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(cols),
                    static_cast<int>(k), 1.0f, x, static_cast<int>(k), w_slice, static_cast<int>(k), beta,
                    y + col0, static_cast<int>(n));
      }
    }
  });
  return Status::kOk;
}

Status embedding_gather(const int32_t* ids, const float* table, float* out, int64_t count,
                        int64_t vocab, int64_t dim, bool accumulate) {
  if (count < 0 || vocab <= 0 || dim <= 0) return Status::kInvalidShape;
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) return Status::kInvalidArgument;
  }
parallel_for(count, kRowGrainElements / dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* src = table + static_cast<int64_t>(ids[i]) * dim;
      float* dst = out + i * dim;
      if (accumulate) {
        for (int64_t j = 0; j < dim; ++j) dst[j] += src[j];
      } else {
        std::memcpy(dst, src, sizeof(float) * dim);
      }
    }
  });
  return Status::kOk;
}

namespace {
inline float inv_rms(const float* v, int64_t dim, float eps) {
  double sum_sq = 0.0;
  for (int64_t j = 0; j < dim; ++j) sum_sq += static_cast<double>(v[j]) * v[j];
  return static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps));
}
}  // namespace

Status rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                float eps) {
  if (rows < 0 || dim <= 0) return Status::kInvalidShape;
parallel_for(rows, kRowGrainElements / dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * dim;
      float* o = out + r * dim;
      const float scale = inv_rms(xr, dim, eps);
      for (int64_t j = 0; j < dim; ++j) o[j] = xr[j] * scale * weight[j];
    }
  });
  return Status::kOk;
}

Status add_rms_norm(float* x, float* residual, const float* weight, int64_t rows, int64_t dim,
                    float eps) {
  if (rows < 0 || dim <= 0) return Status::kInvalidShape;
parallel_for(rows, kRowGrainElements / dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = x + r * dim;
      float* res = residual + r * dim;
      for (int64_t j = 0; j < dim; ++j) res[j] += xr[j];
      const float scale = inv_rms(res, dim, eps);
      for (int64_t j = 0; j < dim; ++j) xr[j] = res[j] * scale * weight[j];
    }
  });
  return Status::kOk;
}

Status layer_norm(float* x, const float* residual, const float* weight, const float* bias,
                  int64_t rows, int64_t dim, float eps) {
  if (rows < 0 || dim <= 0) return Status::kInvalidShape;
parallel_for(rows, kRowGrainElements / dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = x + r * dim;
      if (residual != nullptr) {
        const float* res = residual + r * dim;
        for (int64_t j = 0; j < dim; ++j) xr[j] += res[j];
      }
      double sum = 0.0;
      for (int64_t j = 0; j < dim; ++j) sum += xr[j];
      const double mean = sum / static_cast<double>(dim);
      double var = 0.0;
      for (int64_t j = 0; j < dim; ++j) {
        const double d = xr[j] - mean;
        var += d * d;
      }
      var /= static_cast<double>(dim);
      const float inv_std = static_cast<float>(1.0 / std::sqrt(var + eps));
      const float mean_f = static_cast<float>(mean);
      for (int64_t j = 0; j < dim; ++j) xr[j] = (xr[j] - mean_f) * inv_std * weight[j] + bias[j];
    }
  });
  return Status::kOk;
}

Status rope_inv_freq(const RopeFrequencyParams& p, float* inv_freq) {
  if (p.head_dim <= 0 || p.head_dim % 2 != 0) return Status::kInvalidShape;
  if (!rope_frequencies_valid(p)) return Status::kInvalidArgument;
  rope_inv_freqs(p, inv_freq);
  return Status::kOk;
}

Status kv_copy_rotate(float* k, float* v, const int32_t* src_rows, const int32_t* dst_rows, const int32_t* rotate_by,
                      int64_t rows, int32_t heads, int32_t head_dim, const float* inv_freq) {
  if (rows < 0 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) return Status::kInvalidShape;
  const int64_t width = static_cast<int64_t>(heads) * head_dim;
  const int32_t half = head_dim / 2;
  parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t r = begin; r < end; ++r) {
      const float* k_src = k + static_cast<int64_t>(src_rows[r]) * width;
      float* k_dst = k + static_cast<int64_t>(dst_rows[r]) * width;
      std::copy_n(v + static_cast<int64_t>(src_rows[r]) * width, width, v + static_cast<int64_t>(dst_rows[r]) * width);
      if (rotate_by[r] == 0) {
        std::copy_n(k_src, width, k_dst);
        continue;
      }
      const float pos = static_cast<float>(rotate_by[r]);
      for (int32_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_v[i] = std::cos(angle);
        sin_v[i] = std::sin(angle);
      }
      for (int32_t h = 0; h < heads; ++h) {
        const float* x = k_src + static_cast<int64_t>(h) * head_dim;
        float* y = k_dst + static_cast<int64_t>(h) * head_dim;
        for (int32_t i = 0; i < half; ++i) {
          y[i] = x[i] * cos_v[i] - x[i + half] * sin_v[i];
          y[i + half] = x[i + half] * cos_v[i] + x[i] * sin_v[i];
        }
      }
    }
  });
  return Status::kOk;
}

Status rope_rotate_half(float* x, int64_t row_stride, const int32_t* positions,
                        const float* inv_freq, int64_t rows, int32_t heads, int32_t head_dim) {
  if (rows < 0 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) return Status::kInvalidShape;
  if (row_stride < static_cast<int64_t>(heads) * head_dim) return Status::kInvalidShape;
  const int32_t half = head_dim / 2;
parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t r = begin; r < end; ++r) {
      // Angles in fp32 as transformers forms them (inv_freq * position), then cos/sin.
      const float pos = static_cast<float>(positions[r]);
      for (int32_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_v[i] = std::cos(angle);
        sin_v[i] = std::sin(angle);
      }
      float* row = x + r * row_stride;
      for (int32_t h = 0; h < heads; ++h) {
        float* v = row + static_cast<int64_t>(h) * head_dim;
        for (int32_t i = 0; i < half; ++i) {
          const float x1 = v[i];
          const float x2 = v[i + half];
          v[i] = x1 * cos_v[i] - x2 * sin_v[i];
          v[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
        }
      }
    }
  });
  return Status::kOk;
}

Status silu_mul(const float* gate_up, float* out, int64_t rows, int64_t dim) {
  if (rows < 0 || dim <= 0) return Status::kInvalidShape;
parallel_for(rows, kRowGrainElements / dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up + r * 2 * dim;
      const float* up = gate + dim;
      float* o = out + r * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const float g = gate[j];
        o[j] = g / (1.0f + std::exp(-g)) * up[j];
      }
    }
  });
  return Status::kOk;
}

Status gelu_erf(float* x, int64_t count) {
  if (count < 0) return Status::kInvalidShape;
  const float inv_sqrt2 = static_cast<float>(1.0 / std::numbers::sqrt2);
parallel_for(count, kRowGrainElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * inv_sqrt2));
  });
  return Status::kOk;
}

Status softmax(float* x, int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0) return Status::kInvalidShape;
parallel_for(rows, kRowGrainElements / cols + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* v = x + r * cols;
      const float max_v = *std::max_element(v, v + cols);
      double sum = 0.0;
      for (int64_t j = 0; j < cols; ++j) {
        v[j] = std::exp(v[j] - max_v);
        sum += v[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < cols; ++j) v[j] *= inv;
    }
  });
  return Status::kOk;
}

Status pool_sequences(const float* x, const int32_t* cu_rows, float* out, int32_t num_seqs,
                      int64_t dim, PoolKind kind) {
  if (num_seqs < 0 || dim <= 0) return Status::kInvalidShape;
  for (int32_t s = 0; s < num_seqs; ++s) {
    if (cu_rows[s + 1] <= cu_rows[s]) return Status::kInvalidShape;
  }
parallel_for(num_seqs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      float* o = out + static_cast<int64_t>(s) * dim;
      const int64_t begin = cu_rows[s];
      if (kind == PoolKind::kFirst) {
        std::memcpy(o, x + begin * dim, sizeof(float) * dim);
        continue;
      }
      const int64_t end = cu_rows[s + 1];
      for (int64_t j = 0; j < dim; ++j) {
        double sum = 0.0;
        for (int64_t r = begin; r < end; ++r) sum += x[r * dim + j];
        o[j] = static_cast<float>(sum / static_cast<double>(end - begin));
      }
    }
  });
  return Status::kOk;
}

Status l2_normalize(float* x, int64_t rows, int64_t dim) {
  if (rows < 0 || dim <= 0) return Status::kInvalidShape;
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * dim;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < dim; ++j) sum_sq += static_cast<double>(v[j]) * v[j];
    const float inv = static_cast<float>(1.0 / std::max(std::sqrt(sum_sq), 1e-12));
    for (int64_t j = 0; j < dim; ++j) v[j] *= inv;
  }
  return Status::kOk;
}

}  // namespace tessera::kernels::cpu
