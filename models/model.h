// models/model.h: the interfaces a model graph implements (CausalLm for Llama/Mistral, Encoder for
// BERT) and the per-step input they take. Graphs live in models/<arch>.{h,cpp} and only call Backend
// ops, so the same graph runs on every backend.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "kernels/backend/attention_plan.h"
#include "kernels/backend/backend.h"
#include "models/config/model_config.h"

namespace tessera {

// One step of a packed varlen batch: the tokens of every sequence, laid out as the plan says.
struct ForwardBatch {
  std::span<const int32_t> token_ids;       // [plan.total_q()]
  std::span<const int32_t> token_type_ids;  // [plan.total_q()] (BERT) or empty for all zeros
  const AttentionPlan* plan = nullptr;
  Tensor device_token_ids{};                // token_ids already on the backend (Backend::prepare_step), or undefined

  // The token ids on `be`: device_token_ids when the step sent them up, else an upload.
  Tensor ids_on(Backend& be) const {
    if (device_token_ids.defined()) return device_token_ids;
    return be.upload(token_ids, {static_cast<int64_t>(token_ids.size())}, "token_ids");
  }
};

// Called with every named intermediate ("blk.3.attn_out", ...) as the graph produces it, for tests
// and debug dumps. The tensor is reused afterwards: copy what you keep.
using TensorObserver = std::function<void(const Tensor&)>;

class CausalLm {
 public:
  virtual ~CausalLm() = default;
  virtual const ModelConfig& config() const = 0;
  // KV heads this graph keeps in a KV cache: config().num_kv_heads, or one rank's part of them.
  virtual int64_t cache_kv_heads() const { return config().num_kv_heads; }
  // Runs one step and returns logits f32[logit_rows.size(), vocab] for the given packed rows
  // (usually plan.last_rows()). A paged plan reads and extends `cache`.
  virtual Tensor forward(const ForwardBatch& batch, KvCacheStorage* cache, std::span<const int32_t> logit_rows,
                         const TensorObserver* observer = nullptr) = 0;
  // Copies cached K/V rows between slots in every layer, rotating K by rotate_by[r] positions of the
  // model's RoPE (Backend::copy_kv_rows): a cached document's K/V reused at another position.
  virtual void copy_kv(KvCacheStorage& cache, std::span<const int32_t> src_slots, std::span<const int32_t> dst_slots,
                       std::span<const int32_t> rotate_by) = 0;
};

class Encoder {
 public:
  virtual ~Encoder() = default;
  virtual const ModelConfig& config() const = 0;
  // Last hidden states f32[total_q, hidden] of an unpaged plan.
  virtual Tensor encode(const ForwardBatch& batch, const TensorObserver* observer = nullptr) = 0;
  // Sentence embeddings f32[num_seqs, hidden]: pooled per the config (mean when it says none) and
  // L2-normalised when config().normalize_embeddings.
  virtual Tensor embed(const ForwardBatch& batch, const TensorObserver* observer = nullptr) = 0;
};

}  // namespace tessera
