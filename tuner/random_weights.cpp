// tuner/random_weights.cpp: random_llama_weights.
#include "tuner/random_weights.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"
#include "models/llama.h"
#include "models/tensor_names.h"

namespace tessera::tuner {

namespace {

// splitmix64's finaliser: a counter-based generator, so any element is drawn without its predecessors.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// bf16 of a float by truncation (the low mantissa bits are random anyway).
uint16_t bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

struct Planned {
  std::string name;
  std::vector<int64_t> shape;
  bool ones = false;  // a norm weight
  uint16_t* data = nullptr;
  int64_t count = 0;
};

// Fills values [begin, end) of a matrix: four 16-bit draws per hash, uniform on [-a, a) with
// a = 0.02 * sqrt(3) (standard deviation 0.02).
void fill_uniform(uint16_t* out, int64_t begin, int64_t end, uint64_t stream) {
  constexpr float kScale = 0.0346410162f / 32768.0f;
  int64_t i = begin & ~int64_t{3};
  for (; i < end; i += 4) {
    const uint64_t h = mix(stream ^ mix(static_cast<uint64_t>(i)));
    for (int k = 0; k < 4; ++k) {
      const int64_t at = i + k;
      if (at < begin || at >= end) continue;
      const int32_t r = static_cast<int32_t>((h >> (16 * k)) & 0xffff) - 32768;
      out[at] = bf16_bits(static_cast<float>(r) * kScale);
    }
  }
}

}  // namespace

WeightStore random_llama_weights(const ModelConfig& config, uint64_t seed) {
  TESSERA_CHECK(config.arch == Architecture::kLlama || config.arch == Architecture::kMistral,
                config.source << ": random weights are drawn for Llama-family decoders only, not a "
                              << architecture_name(config.arch) << " model");
  const LlamaHyperParams hp = LlamaHyperParams::from_config(config);
  const int64_t hidden = hp.hidden_size, inter = hp.intermediate_size;
  const int64_t q_rows = static_cast<int64_t>(hp.num_heads) * hp.head_dim;
  const int64_t kv_rows = static_cast<int64_t>(hp.num_kv_heads) * hp.head_dim;
  const TensorNames names(config.arch);
  using enum TensorKind;
  std::vector<Planned> plan;
  plan.push_back({names.weight(kTokenEmbedding), {hp.vocab_size, hidden}});
  for (int64_t l = 0; l < hp.num_layers; ++l) {
    plan.push_back({names.weight(kAttnNorm, l), {hidden}, true});
    plan.push_back({names.weight(kAttnQ, l), {q_rows, hidden}});
    plan.push_back({names.weight(kAttnK, l), {kv_rows, hidden}});
    plan.push_back({names.weight(kAttnV, l), {kv_rows, hidden}});
    plan.push_back({names.weight(kAttnOut, l), {hidden, q_rows}});
    plan.push_back({names.weight(kFfnNorm, l), {hidden}, true});
    plan.push_back({names.weight(kFfnGate, l), {inter, hidden}});
    plan.push_back({names.weight(kFfnUp, l), {inter, hidden}});
    plan.push_back({names.weight(kFfnDown, l), {hidden, inter}});
  }
  plan.push_back({names.weight(kOutputNorm), {hidden}, true});
  if (!hp.tie_word_embeddings) plan.push_back({names.weight(kOutput), {hp.vocab_size, hidden}});

  // One allocation per tensor, left uninitialised: the threads write every value once.
  WeightStore store;
  for (Planned& p : plan) {
    p.count = 1;
    for (int64_t d : p.shape) p.count *= d;
    std::shared_ptr<uint16_t[]> buffer(new uint16_t[static_cast<size_t>(p.count)]);
    p.data = buffer.get();
    store.keep_alive(std::shared_ptr<const void>(buffer, buffer.get()));
  }

  // Work in slices of ~1M values over all tensors, taken in turn by the threads.
  constexpr int64_t kSlice = int64_t{1} << 20;
  struct Slice {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Slice> slices;
  for (size_t t = 0; t < plan.size(); ++t) {
    for (int64_t b = 0; b < plan[t].count; b += kSlice) slices.push_back({t, b, std::min(b + kSlice, plan[t].count)});
  }
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t s = next++; s < slices.size(); s = next++) {
      const Slice& slice = slices[s];
      Planned& p = plan[slice.tensor];
      if (p.ones) {
        std::fill(p.data + slice.begin, p.data + slice.end, bf16_bits(1.0f));
      } else {
        fill_uniform(p.data, slice.begin, slice.end, mix(seed ^ mix(slice.tensor + 1)));
      }
    }
  };
  const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(),
                                                           static_cast<unsigned>(slices.size())));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();

  for (Planned& p : plan) {
    WeightView view;
    view.name = p.name;
    view.dtype = DType::kBF16;
    view.shape = p.shape;
    view.bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(p.data),
                                            static_cast<size_t>(p.count) * sizeof(uint16_t));
    view.source_file = "random weights (seed " + std::to_string(seed) + ")";
    store.add(std::move(view));
  }
  return store;
}

}  // namespace tessera::tuner
