// kernels/cpu/quant/kernels_scalar.cpp: the portable path, for CPUs without AVX2 and as the plain
// statement of what the SIMD paths compute: per block, an exact integer dot product of weight and
// activation quants, scaled in fp32.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/quant/kernel_table.h"

namespace tessera::kernels::cpu::quant_detail {
namespace {

void quantize_rows(const float* x, int64_t r0, int64_t r1, Q8Rows& out) {
  const int64_t k = out.k, nb = out.blocks;
  const bool wide = out.sixteen_bit();
  const float top = wide ? static_cast<float>(kActivation16Max) : 127.0f;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + r * k + b * kQuantBlock;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
      // The same arithmetic as the SIMD paths: one division, round half to even.
      const float inv = amax > 0.0f ? top / amax : 0.0f;
      int8_t* q = out.q + r * k + b * kQuantBlock;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const float t = std::nearbyint(v[i] * inv);
        sum += static_cast<int>(t);
        if (!wide) {
          q[i] = static_cast<int8_t>(t);
          continue;
        }
        // t = 255 hi + lo. t / 255 is never a tie (2t would be an odd multiple of 255), and the
        // float product is far closer than 1/510 to it, so hi is the nearest integer to t / 255.
        const float hi = std::nearbyint(t * (1.0f / static_cast<float>(kDigitBase)));
        q[i] = static_cast<int8_t>(hi);
        out.q_lo[r * k + b * kQuantBlock + i] = static_cast<int8_t>(t - static_cast<float>(kDigitBase) * hi);
      }
      const float d = amax / top;
      out.d[r * nb + b] = d;
      out.s[b * out.rows + r] = d * static_cast<float>(sum);
      out.sums[b * out.rows + r] = sum;
    }
  }
}

// The block's activation integers of row r: q (8-bit) or 255 q + q_lo (16-bit).
void activation_ints(const Q8Rows& x, int64_t r, int64_t b, int32_t* t) {
  const int64_t at = r * x.k + b * kQuantBlock;
  for (int i = 0; i < 32; ++i) {
    t[i] = x.q[at + i];
    if (x.sixteen_bit()) t[i] = kDigitBase * t[i] + x.q_lo[at + i];
  }
}

// Weight quants of block `blk` as signed values w_i with value_i = d * w_i + m.
template <WeightFormat F>
void unpack(const std::byte* blk, int32_t* w, float* d, float* m) {
  *d = f16_to_f32(load_u16(blk));
  *m = 0.0f;
  if constexpr (F == WeightFormat::kQ8_0) {
    for (int i = 0; i < 32; ++i) w[i] = static_cast<int8_t>(blk[2 + i]);
  } else {
    const std::byte* nibbles = blk + (F == WeightFormat::kQ4_1 ? 4 : 2);
    const int offset = F == WeightFormat::kQ4_0 ? 8 : 0;
    for (int i = 0; i < 16; ++i) {
      const auto q = static_cast<uint8_t>(nibbles[i]);
      w[i] = (q & 0x0f) - offset;
      w[i + 16] = (q >> 4) - offset;
    }
    if constexpr (F == WeightFormat::kQ4_1) *m = f16_to_f32(load_u16(blk + 2));
  }
}

template <WeightFormat F>
constexpr size_t block_bytes() {
  return F == WeightFormat::kQ8_0 ? kQ8_0BlockBytes : F == WeightFormat::kQ4_0 ? kQ4_0BlockBytes : kQ4_1BlockBytes;
}

template <WeightFormat F>
void quant_matmul(const Q8Rows& x, const std::byte* w, size_t row_bytes, int64_t j0, int64_t j1, float* y,
                  int64_t ldy) {
  const int64_t nb = x.blocks;
  int32_t wq[32], t[32];
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t r = 0; r < x.rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        float d, m;
        unpack<F>(w + j * row_bytes + b * block_bytes<F>(), wq, &d, &m);
        activation_ints(x, r, b, t);
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += wq[i] * t[i];
        // sum_i (d w_i + m) (dx q_i) = d dx dot + m (dx sum q)
        acc += d * x.d[r * nb + b] * static_cast<float>(dot) + m * x.s[b * x.rows + r];
      }
      y[r * ldy + j] = acc;
    }
  }
}

// Row `lane`'s weight quants of interleaved group block `blk` (formats.h), as unpack() gives them.
template <WeightFormat F>
void unpack_interleaved(const std::byte* blk, int lane, int32_t* w, float* d, float* m) {
  *d = f16_to_f32(load_u16(blk + 2 * lane));
  *m = F == WeightFormat::kQ4_1x8 ? f16_to_f32(load_u16(blk + 16 + 2 * lane)) : 0.0f;
  const std::byte* quants = blk + (F == WeightFormat::kQ4_1x8 ? 32 : 16);
  auto byte_at = [&](int e) { return static_cast<uint8_t>(quants[32 * (e / 4) + 4 * lane + e % 4]); };
  if constexpr (F == WeightFormat::kQ8_0x8) {
    for (int i = 0; i < 32; ++i) w[i] = static_cast<int32_t>(byte_at(i)) - 128;
  } else {
    const int offset = F == WeightFormat::kQ4_0x8 ? 8 : 0;
    for (int i = 0; i < 16; ++i) {
      w[i] = (byte_at(i) & 0x0f) - offset;
      w[i + 16] = (byte_at(i) >> 4) - offset;
    }
  }
}

template <WeightFormat F>
void interleaved_matmul(const Q8Rows& x, const std::byte* w, size_t row_bytes, int64_t j0, int64_t j1, float* y,
                        int64_t ldy) {
  const int64_t nb = x.blocks;
  const size_t group_block_bytes = row_bytes / static_cast<size_t>(nb) * kInterleaveRows;
  int32_t wq[32], t[32];
  for (int64_t j = j0; j < j1; ++j) {
    const std::byte* group = w + (j / kInterleaveRows) * kInterleaveRows * row_bytes;
    const int lane = static_cast<int>(j % kInterleaveRows);
    for (int64_t r = 0; r < x.rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        float d, m;
        unpack_interleaved<F>(group + b * group_block_bytes, lane, wq, &d, &m);
        activation_ints(x, r, b, t);
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += wq[i] * t[i];
        acc += d * x.d[r * nb + b] * static_cast<float>(dot) + m * x.s[b * x.rows + r];
      }
      y[r * ldy + j] = acc;
    }
  }
}

template <bool kBf16>
void float_matmul(const float* x, int64_t m, int64_t k, const std::byte* w, size_t row_bytes, int64_t j0, int64_t j1,
                  float* y, int64_t ldy) {
  for (int64_t j = j0; j < j1; ++j) {
    const std::byte* row = w + j * row_bytes;
    for (int64_t r = 0; r < m; ++r) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        const uint16_t h = load_u16(row + 2 * i);
        acc += x[r * k + i] * (kBf16 ? bf16_to_f32(h) : f16_to_f32(h));
      }
      y[r * ldy + j] = acc;
    }
  }
}

void widen_f16(const std::byte* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
}

void widen_bf16(const std::byte* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{quantize_rows,
                                 quant_matmul<WeightFormat::kQ8_0>,
                                 quant_matmul<WeightFormat::kQ4_0>,
                                 quant_matmul<WeightFormat::kQ4_1>,
                                 interleaved_matmul<WeightFormat::kQ8_0x8>,
                                 interleaved_matmul<WeightFormat::kQ4_0x8>,
                                 interleaved_matmul<WeightFormat::kQ4_1x8>,
                                 float_matmul<false>,
                                 float_matmul<true>,
                                 widen_f16,
                                 widen_bf16};
  return table;
}

}  // namespace tessera::kernels::cpu::quant_detail
