// kernels/rope_frequencies.h: the one definition of RoPE's inverse frequencies, shared by the CPU
// kernels and the CUDA backend (which computes the table here on the host and uploads it once), so
// both rotate by the same fp32 values. Follows transformers: the base frequencies
// 1 / theta^(2i / head_dim) in fp32 (ROPE_INIT_FUNCTIONS["default"]), and Llama 3.1's
// "rope_type": "llama3" smoothing (_compute_llama3_parameters), evaluated in double and rounded
// once to fp32 (transformers' fp32 arithmetic differs from it by at most an ulp or so).
#pragma once

#include <math.h>

#include <cstdint>

#if !defined(TESSERA_HOST_DEVICE)
#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TESSERA_HOST_DEVICE inline
#endif
#endif

namespace tessera::kernels {

struct RopeFrequencyParams {
  int32_t head_dim = 0;
  double theta = 10000.0;
  // Llama 3.1 scaling: wavelengths longer than original_max_position_embeddings / low_freq_factor
  // are stretched by `factor`, those shorter than ... / high_freq_factor kept, the band between
  // blended.
  bool llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// Whether the table can be computed: an even head_dim > 0, theta > 0 and, with llama3, factor > 0,
// high_freq_factor > low_freq_factor and original_max_position_embeddings > 0.
TESSERA_HOST_DEVICE bool rope_frequencies_valid(const RopeFrequencyParams& p) {
  if (p.head_dim <= 0 || p.head_dim % 2 != 0 || !(p.theta > 0.0)) return false;
  if (!p.llama3) return true;
  return p.factor > 0.0 && p.high_freq_factor > p.low_freq_factor && p.original_max_position_embeddings > 0.0;
}

// The inverse frequency of pair i (0 <= i < head_dim / 2); p must be valid.
TESSERA_HOST_DEVICE float rope_inv_freq_at(const RopeFrequencyParams& p, int32_t i) {
  // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)): the exponent, the power and
  // the reciprocal all in fp32.
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(p.head_dim);
  const float inv = 1.0f / powf(static_cast<float>(p.theta), exponent);
  if (!p.llama3) return inv;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double freq = inv;
  const double wavelen = kTwoPi / freq;
  const double low_freq_wavelen = p.original_max_position_embeddings / p.low_freq_factor;
  const double high_freq_wavelen = p.original_max_position_embeddings / p.high_freq_factor;
  double scaled = freq;
  if (wavelen > low_freq_wavelen) {
    scaled = freq / p.factor;
  } else if (wavelen >= high_freq_wavelen) {
    const double smooth = (p.original_max_position_embeddings / wavelen - p.low_freq_factor) /
                          (p.high_freq_factor - p.low_freq_factor);
    scaled = (1.0 - smooth) * freq / p.factor + smooth * freq;
  }
  return static_cast<float>(scaled);
}

// inv_freq[i] for every pair: [head_dim / 2] floats. False (nothing written) when p is invalid.
TESSERA_HOST_DEVICE bool rope_inv_freqs(const RopeFrequencyParams& p, float* inv_freq) {
  if (!rope_frequencies_valid(p)) return false;
  for (int32_t i = 0; i < p.head_dim / 2; ++i) inv_freq[i] = rope_inv_freq_at(p, i);
  return true;
}

}  // namespace tessera::kernels
