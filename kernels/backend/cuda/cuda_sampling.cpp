// kernels/backend/cuda/cuda_sampling.cpp: CudaBackend::sample, sampling on the device: the rows'
// parameters, penalty lists and grammar bitmasks go up in one copy, min_tokens and grammar masks are
// written into the logits, one kernel samples every row, and the sampled tokens (with any top
// logprobs) come back in one copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/backend/cuda/cuda_backend_impl.h"
#include "kernels/cuda/sampling/sampling.h"

namespace tessera {

using cuda_backend_detail::as_int;
using cuda_backend_detail::kAlign;
using cuda_backend_detail::round_up;

namespace {

kc::LogitsType logits_type_of(const Tensor& logits) {
  kc::LogitsType type = kc::LogitsType::kF32;
  if (logits.type() == ScalarType::kBF16) type = kc::LogitsType::kBF16;
  if (logits.type() == ScalarType::kF16) type = kc::LogitsType::kFP16;
  TESSERA_CHECK(type != kc::LogitsType::kF32 || logits.type() == ScalarType::kF32,
                "cuda sample: " << logits.describe() << " is not a float tensor");
  return type;
}

// Each row's parameters, its penalty tokens and their counts appended to `tokens` and `counts`
// (the row's [penalty_begin, penalty_end)).
void write_row_params(std::span<const SampleSpec> rows, std::vector<kc::SamplingRowParams>& params, int32_t* tokens,
                      int32_t* counts) {
  int32_t next_penalty = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleSpec& row = rows[i];
    TESSERA_CHECK(row.penalty_counts.empty() || row.penalty_counts.size() == row.penalty_tokens.size(),
                  "cuda sample: row " << i << " has " << row.penalty_counts.size() << " penalty counts for "
                                      << row.penalty_tokens.size() << " tokens");
    const int32_t penalty_begin = next_penalty;
    for (size_t j = 0; j < row.penalty_tokens.size(); ++j) {
      tokens[next_penalty] = row.penalty_tokens[j];
      counts[next_penalty] = row.penalty_counts.empty() ? 0 : row.penalty_counts[j];
      ++next_penalty;
    }
    params[i] = {.temperature = row.temperature,
                 .top_k = row.top_k,
                 .top_p = row.top_p,
                 .min_p = row.min_p,
                 .repetition_penalty = row.repetition_penalty,
                 .presence_penalty = row.presence_penalty,
                 .frequency_penalty = row.frequency_penalty,
                 .uniform = static_cast<float>(row.uniform),
                 .num_top_logprobs = row.num_top_logprobs,
                 .penalty_begin = penalty_begin,
                 .penalty_end = next_penalty};
  }
}

// The rows with a grammar mask, and their bitmasks one after another.
void write_bitmasks(std::span<const SampleSpec> rows, std::span<const int32_t> masked_rows, size_t words,
                    int32_t* row_ids, int32_t* bitmasks) {
  for (size_t k = 0; k < masked_rows.size(); ++k) {
    const SampleSpec& row = rows[static_cast<size_t>(masked_rows[k])];
    TESSERA_CHECK(row.allowed_tokens.size() == words, "cuda sample: row " << masked_rows[k] << " has a grammar mask of "
                                                          << row.allowed_tokens.size() << " words, expected " << words);
    row_ids[k] = masked_rows[k];
    std::memcpy(bitmasks + k * words, row.allowed_tokens.data(), words * sizeof(int32_t));
  }
}

std::vector<SampleOutcome> outcomes_of(const kc::SampledRow* sampled, std::span<const SampleSpec> rows, int vocab) {
  std::vector<SampleOutcome> outcomes(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const kc::SampledRow& row = sampled[i];
    TESSERA_CHECK(row.token >= 0 && row.token < vocab, "cuda sample: row " << i << " sampled no token (NaN logits?)");
    outcomes[i].token = row.token;
    outcomes[i].logprob = row.logprob;
    for (int j = 0; j < std::min(rows[i].num_top_logprobs, kc::kMaxTopLogprobs); ++j) {
      outcomes[i].top.emplace_back(row.top_ids[j], row.top_logprobs[j]);
    }
  }
  return outcomes;
}

}  // namespace

void CudaBackend::Impl::reserve_sample_buffers(size_t bytes) {
  if (bytes <= sample_bytes) return;
  check(cudaStreamSynchronize(stream), "sampling buffers");
  if (sample_host != nullptr) cudaFreeHost(sample_host);
  if (sample_device != nullptr) cudaFree(sample_device);
  const size_t grown = round_up(bytes * 2, size_t{1} << 16);
  check(cudaMallocHost(&sample_host, grown), "pinned sampling buffer");
  sample_device = device_alloc(grown, "the sampling buffer");
  sample_bytes = grown;
}

void CudaBackend::Impl::reserve_sampling_workspace(size_t bytes) {
  if (bytes <= sampling_workspace_bytes) return;
  check(cudaStreamSynchronize(stream), "sampling workspace");
  if (sampling_workspace != nullptr) cudaFree(sampling_workspace);
  sampling_workspace_bytes = round_up(bytes * 2, kAlign);
  sampling_workspace = device_alloc(sampling_workspace_bytes, "the sampling workspace");
}

void CudaBackend::Impl::mask_tokens(const Tensor& logits, std::span<const SampleSpec> rows, int vocab) {
  // min_tokens: a masked token's logit becomes a very negative finite value (every byte 0xFB: about
  // -2.6e36 in f32 and bf16, -65376 in fp16), which exp() turns into probability 0 in every dtype,
  // set in place before the kernel reads the row.
  const int64_t element_bytes = scalar_type_bytes(logits.type());
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const int32_t t : rows[i].masked_tokens) {
      TESSERA_CHECK(t >= 0 && t < vocab,
                    "cuda sample: row " << i << " masks token " << t << ", outside the vocabulary");
      char* logit =
          static_cast<char*>(const_cast<void*>(logits.data())) + (static_cast<int64_t>(i) * vocab + t) * element_bytes;
      check(cudaMemsetAsync(logit, 0xFB, static_cast<size_t>(element_bytes), stream), "sampling mask");
    }
  }
}

std::vector<SampleOutcome> CudaBackend::sample(const Tensor& logits, std::span<const SampleSpec> rows) {
  Impl& gpu = *impl_;
  gpu.enter();
  cuda_backend_detail::check_device(logits, "sample");
  TESSERA_CHECK(logits.shape().size() == 2 && logits.dim(0) == static_cast<int64_t>(rows.size()),
                "cuda sample: " << logits.describe() << " for " << rows.size() << " rows");
  const int num_rows = static_cast<int>(rows.size());
  const int vocab = as_int(logits.dim(1), "vocab");
  if (num_rows == 0) return {};
  const kc::LogitsType type = logits_type_of(logits);

  // Staging: [params][penalty tokens][penalty counts][masked rows][bitmasks][out], each on a kAlign
  // boundary.
  std::vector<kc::SamplingRowParams> params(rows.size());
  size_t penalties = 0;
  std::vector<int32_t> masked_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    penalties += rows[i].penalty_tokens.size();
    if (!rows[i].allowed_tokens.empty()) masked_rows.push_back(static_cast<int32_t>(i));
  }
  const size_t words = (static_cast<size_t>(vocab) + 31) / 32;
  const size_t params_bytes = round_up(params.size() * sizeof(kc::SamplingRowParams), kAlign);
  const size_t tokens_bytes = round_up(std::max<size_t>(penalties, 1) * 4, kAlign);
  const size_t masked_bytes = round_up(std::max<size_t>(masked_rows.size(), 1) * 4, kAlign);
  const size_t bitmask_bytes = round_up(masked_rows.size() * words * 4, kAlign);
  const size_t upload_bytes = params_bytes + 2 * tokens_bytes + masked_bytes + bitmask_bytes;
  const size_t out_bytes = round_up(rows.size() * sizeof(kc::SampledRow), kAlign);
  gpu.reserve_sample_buffers(upload_bytes + out_bytes);
  char* host = static_cast<char*>(gpu.sample_host);
  char* device = static_cast<char*>(gpu.sample_device);
  write_row_params(rows, params, reinterpret_cast<int32_t*>(host + params_bytes),
                   reinterpret_cast<int32_t*>(host + params_bytes + tokens_bytes));
  std::memcpy(host, params.data(), params.size() * sizeof(kc::SamplingRowParams));
  const size_t masked_at = params_bytes + 2 * tokens_bytes;
  write_bitmasks(rows, masked_rows, words, reinterpret_cast<int32_t*>(host + masked_at),
                 reinterpret_cast<int32_t*>(host + masked_at + masked_bytes));
  gpu.check(cudaMemcpyAsync(device, host, upload_bytes, cudaMemcpyHostToDevice, gpu.stream), "sampling upload");
  gpu.mask_tokens(logits, rows, vocab);
  gpu.check(kc::mask_disallowed_tokens(type, const_cast<void*>(logits.data()), vocab, vocab,
                                       reinterpret_cast<const int32_t*>(device + masked_at),
                                       static_cast<int>(masked_rows.size()),
                                       reinterpret_cast<const int32_t*>(device + masked_at + masked_bytes), gpu.stream),
            "grammar mask", logits);

  gpu.reserve_sampling_workspace(kc::sampling_workspace_bytes(num_rows, vocab));
  gpu.check_supported(kc::sampling_unsupported(num_rows, vocab, vocab, gpu.sampling_workspace_bytes), "sample");
  auto* out_device = reinterpret_cast<kc::SampledRow*>(device + upload_bytes);
  gpu.check(kc::sample_rows(type, logits.data(), vocab, num_rows, vocab,
                            reinterpret_cast<const kc::SamplingRowParams*>(device),
                            reinterpret_cast<const int32_t*>(device + params_bytes),
                            reinterpret_cast<const int32_t*>(device + params_bytes + tokens_bytes),
                            gpu.sampling_workspace, gpu.sampling_workspace_bytes, out_device, gpu.stream),
            "sample", logits);
  auto* out_host = reinterpret_cast<kc::SampledRow*>(host + upload_bytes);
  gpu.check(
      cudaMemcpyAsync(out_host, out_device, rows.size() * sizeof(kc::SampledRow), cudaMemcpyDeviceToHost, gpu.stream),
      "sampling download");
  gpu.check(cudaStreamSynchronize(gpu.stream), "sample");
  return outcomes_of(out_host, rows, vocab);
}

}  // namespace tessera
