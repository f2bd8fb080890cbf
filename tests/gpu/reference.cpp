// tests/gpu/reference.cpp: CPU attention references, straight from MaskParams::visible.
#include "reference.h"

#include <algorithm>
#include <cmath>

namespace tessera::gpu_test {

std::vector<float> reference_prefill(const std::vector<float>& q, int64_t q_stride, const std::vector<float>& k,
                                     int64_t k_stride, const std::vector<float>& v, int64_t v_stride,
                                     const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                                     const std::vector<kernels::MaskParams>& masks, int num_heads, int num_kv_heads,
                                     int head_dim, float scale) {
  const int total_q = cu_q.back();
  std::vector<float> out(static_cast<size_t>(total_q) * num_heads * head_dim, 0.f);
  const int group = num_heads / num_kv_heads;
  std::vector<double> scores;
  for (size_t s = 0; s + 1 < cu_q.size(); ++s) {
    const int q_len = cu_q[s + 1] - cu_q[s], kv_len = cu_k[s + 1] - cu_k[s];
    scores.resize(std::max(kv_len, 1));
    for (int h = 0; h < num_heads; ++h) {
      const int kvh = h / group;
      for (int i = 0; i < q_len; ++i) {
        const int pos = kv_len - q_len + i;
        const float* qr = &q[(cu_q[s] + i) * q_stride + h * head_dim];
        double mx = -INFINITY;
        for (int j = 0; j < kv_len; ++j) {
          if (!masks[s].visible(pos, j)) {
            scores[j] = -INFINITY;
            continue;
          }
          const float* kr = &k[(cu_k[s] + j) * k_stride + kvh * head_dim];
          double d = 0;
          for (int e = 0; e < head_dim; ++e) d += static_cast<double>(qr[e]) * kr[e];
          scores[j] = d * scale;
          mx = std::max(mx, scores[j]);
        }
        float* o = &out[(static_cast<size_t>(cu_q[s] + i) * num_heads + h) * head_dim];
        if (mx == -INFINITY) continue;  // sees nothing: 0
        double sum = 0;
        std::vector<double> acc(head_dim, 0.0);
        for (int j = 0; j < kv_len; ++j) {
          if (scores[j] == -INFINITY) continue;
          const double p = std::exp(scores[j] - mx);
          sum += p;
          const float* vr = &v[(cu_k[s] + j) * v_stride + kvh * head_dim];
          for (int e = 0; e < head_dim; ++e) acc[e] += p * vr[e];
        }
        for (int e = 0; e < head_dim; ++e) o[e] = static_cast<float>(acc[e] / sum);
      }
    }
  }
  return out;
}

std::vector<float> reference_decode(const std::vector<float>& q, const std::vector<float>& k_cache,
                                    const std::vector<float>& v_cache, const std::vector<int32_t>& block_tables,
                                    const std::vector<int32_t>& context_lens,
                                    const std::vector<kernels::MaskParams>* masks, int num_heads, int num_kv_heads,
                                    int head_dim, int block_size, int max_blocks_per_seq, float scale) {
  const int num_seqs = static_cast<int>(context_lens.size());
  std::vector<float> out(static_cast<size_t>(num_seqs) * num_heads * head_dim, 0.f);
  const int group = num_heads / num_kv_heads;
  for (int s = 0; s < num_seqs; ++s) {
    const int ctx = context_lens[s];
    const int pos = ctx - 1;
    kernels::MaskParams causal;
    const kernels::MaskParams& mask = masks ? (*masks)[s] : causal;
    auto row = [&](int token, int kvh) {
      const int64_t block = block_tables[static_cast<size_t>(s) * max_blocks_per_seq + token / block_size];
      return ((block * block_size + token % block_size) * num_kv_heads + kvh) * head_dim;
    };
    for (int h = 0; h < num_heads; ++h) {
      const int kvh = h / group;
      const float* qr = &q[(static_cast<size_t>(s) * num_heads + h) * head_dim];
      std::vector<double> scores(std::max(ctx, 1), -INFINITY);
      double mx = -INFINITY;
      for (int j = 0; j < ctx; ++j) {
        if (!mask.visible(pos, j)) continue;
        const float* kr = &k_cache[row(j, kvh)];
        double d = 0;
        for (int e = 0; e < head_dim; ++e) d += static_cast<double>(qr[e]) * kr[e];
        scores[j] = d * scale;
        mx = std::max(mx, scores[j]);
      }
      if (mx == -INFINITY) continue;
      double sum = 0;
      std::vector<double> acc(head_dim, 0.0);
      for (int j = 0; j < ctx; ++j) {
        if (scores[j] == -INFINITY) continue;
        const double p = std::exp(scores[j] - mx);
        sum += p;
        const float* vr = &v_cache[row(j, kvh)];
        for (int e = 0; e < head_dim; ++e) acc[e] += p * vr[e];
      }
      float* o = &out[(static_cast<size_t>(s) * num_heads + h) * head_dim];
      for (int e = 0; e < head_dim; ++e) o[e] = static_cast<float>(acc[e] / sum);
    }
  }
  return out;
}

}  // namespace tessera::gpu_test
