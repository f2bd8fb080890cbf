// models/llama.cpp: Llama hyper-parameters, weight loading and the forward graph.
#include "models/llama.h"

#include <cmath>

#include "common/error.h"
#include "kernels/rope_frequencies.h"
#include "models/graph_weights.h"
#include "models/tensor_names.h"

namespace tessera {

// ---------------------------------------------------------------- hyper-parameters

LlamaHyperParams LlamaHyperParams::from_config(const ModelConfig& c) {
  TESSERA_CHECK(c.arch == Architecture::kLlama || c.arch == Architecture::kMistral,
                c.source << ": a " << architecture_name(c.arch) << " model is not a Llama-family decoder");
  TESSERA_CHECK(c.num_layers >= 1, c.source << ": num_layers must be >= 1, got " << c.num_layers);
  TESSERA_CHECK(c.num_heads >= 1 && c.num_kv_heads >= 1 && c.num_heads % c.num_kv_heads == 0,
                c.source << ": num_key_value_heads (" << c.num_kv_heads << ") must divide num_attention_heads ("
                         << c.num_heads << ")");
  TESSERA_CHECK(c.head_dim >= 2 && c.head_dim % 2 == 0,
                c.source << ": head_dim must be even for RoPE, got " << c.head_dim);
  TESSERA_CHECK(c.hidden_size >= 1 && c.intermediate_size >= 1 && c.vocab_size >= 1,
                c.source << ": hidden_size, intermediate_size and vocab_size must be >= 1");
  LlamaHyperParams hp;
  hp.num_layers = c.num_layers;
  hp.hidden_size = c.hidden_size;
  hp.intermediate_size = c.intermediate_size;
  hp.num_heads = static_cast<int32_t>(c.num_heads);
  hp.num_kv_heads = static_cast<int32_t>(c.num_kv_heads);
  hp.head_dim = static_cast<int32_t>(c.head_dim);
  hp.vocab_size = c.vocab_size;
  hp.rms_norm_eps = static_cast<float>(c.norm_eps);
  hp.rope_theta = c.rope_theta;
  hp.rope_scaling = c.rope_scaling;
  hp.tie_word_embeddings = c.tie_word_embeddings;
  return hp;
}

LlamaHyperParams LlamaHyperParams::sharded(const TensorShard& shard) const {
  if (!shard.split()) return *this;
  auto check_splits = [&](int64_t count, const char* what) {
    TESSERA_CHECK(count % shard.size == 0, "tensor_parallel " << shard.size << ": the model's " << what << " (" << count
                                                              << ") do not split evenly over " << shard.size
                                                              << " ranks; serve it on a number of GPUs that divides "
                                                                 "its KV heads ("
                                                              << num_kv_heads << ") and attention heads (" << num_heads
                                                              << ")");
  };
  check_splits(num_kv_heads, "KV heads (num_key_value_heads)");
  check_splits(num_heads, "attention heads (num_attention_heads)");
  check_splits(intermediate_size, "FFN columns (intermediate_size)");
  LlamaHyperParams local = *this;
  local.num_heads = static_cast<int32_t>(shard.part(num_heads));
  local.num_kv_heads = static_cast<int32_t>(shard.part(num_kv_heads));
  local.intermediate_size = shard.part(intermediate_size);
  return local;
}

// ---------------------------------------------------------------- tensors

namespace {

// A layer's weights as one rank of a tensor-parallel group loads them: q/k/v and gate/up by output
// rows, o_proj and down by input columns, each the rank's contiguous part.
class ShardedLoader {
 public:
  ShardedLoader(const WeightStore& store, Backend& backend, const TensorShard& shard)
      : store_(store), backend_(backend), shard_(shard) {}

  // Rows [first, first + count) of each named weight, stacked (count: this rank's part of its rows).
  Tensor stacked_rows(std::span<const std::string> names, std::span<const std::vector<int64_t>> full_shapes,
                      const std::string& fused_name, WeightUse use) const {
    std::vector<WeightView> views;
    std::vector<std::vector<int64_t>> shapes;
    for (size_t i = 0; i < names.size(); ++i) {
      views.push_back(row_part(store_.get(names[i]), full_shapes[i]));
      shapes.push_back(views.back().shape);
    }
    std::vector<const WeightView*> parts;
    for (const WeightView& view : views) parts.push_back(&view);
    return backend_.load_stacked(parts, shapes, fused_name, use);
  }
  Tensor rows(const std::string& name, const std::vector<int64_t>& full_shape, WeightUse use) const {
    const WeightView view = row_part(store_.get(name), full_shape);
    return backend_.load_weight(view, view.shape, use);
  }
  Tensor columns(const std::string& name, const std::vector<int64_t>& full_shape, WeightUse use) const {
    const WeightView& whole = store_.get(name);
    check_weight_shape(whole, full_shape);
    if (!shard_.split()) return backend_.load_weight(whole, full_shape, use);
    std::vector<std::byte> storage;
    const WeightView view =
        weight_columns(whole, shard_.first(full_shape[1]), shard_.part(full_shape[1]), storage);
    return backend_.load_weight(view, view.shape, use);
  }

 private:
  WeightView row_part(const WeightView& whole, const std::vector<int64_t>& full_shape) const {
    check_weight_shape(whole, full_shape);
    if (!shard_.split()) return whole;
    return weight_rows(whole, shard_.first(full_shape[0]), shard_.part(full_shape[0]));
  }

  const WeightStore& store_;
  Backend& backend_;
  TensorShard shard_;
};

}  // namespace

LlamaWeights LlamaWeights::load(const LlamaHyperParams& hp, const WeightStore& store, Backend& backend,
                                const GraphOptions& options, const TensorShard& shard) {
  const int64_t hidden = hp.hidden_size;
  const int64_t q_rows = static_cast<int64_t>(hp.num_heads) * hp.head_dim;
  const int64_t kv_rows = static_cast<int64_t>(hp.num_kv_heads) * hp.head_dim;
  // Only the layers' projections are kLinear: the embedding and the lm_head stay unquantized.
  constexpr WeightUse kLinear = WeightUse::kLinear;
  constexpr WeightUse kOther = WeightUse::kOther;
  const TensorNames names(Architecture::kLlama);
  using enum TensorKind;
  const ShardedLoader sharded(store, backend, shard);
  LlamaWeights w;
  w.token_embedding = load_weight(backend, store, names.weight(kTokenEmbedding), {hp.vocab_size, hidden}, kOther);
  for (int64_t l = 0; l < hp.num_layers; ++l) {
    LlamaLayerWeights layer;
    layer.attn_norm = load_weight(backend, store, names.weight(kAttnNorm, l), {hidden}, kOther);
    const std::vector<std::string> qkv_names{names.weight(kAttnQ, l), names.weight(kAttnK, l), names.weight(kAttnV, l)};
    const std::vector<std::vector<int64_t>> qkv_shapes{{q_rows, hidden}, {kv_rows, hidden}, {kv_rows, hidden}};
    if (options.fuse_qkv) {
      layer.qkv = sharded.stacked_rows(qkv_names, qkv_shapes, "model.layers." + std::to_string(l) + ".qkv", kLinear);
    } else {
      layer.q_proj = sharded.rows(qkv_names[0], qkv_shapes[0], kLinear);
      layer.k_proj = sharded.rows(qkv_names[1], qkv_shapes[1], kLinear);
      layer.v_proj = sharded.rows(qkv_names[2], qkv_shapes[2], kLinear);
    }
    const std::vector<std::string> bias_names{names.bias(kAttnQ, l), names.bias(kAttnK, l), names.bias(kAttnV, l)};
    const int present = store.contains(bias_names[0]) + store.contains(bias_names[1]) + store.contains(bias_names[2]);
    TESSERA_CHECK(present == 0 || present == 3,
                  "layer " << l << " has only some of the q/k/v projection biases (" << bias_names[0] << ", ...)");
    if (present == 3) {
      const std::vector<std::vector<int64_t>> bias_shapes{{q_rows}, {kv_rows}, {kv_rows}};
      layer.qkv_bias =
          sharded.stacked_rows(bias_names, bias_shapes, "model.layers." + std::to_string(l) + ".qkv_bias", kOther);
    }
    layer.o_proj = sharded.columns(names.weight(kAttnOut, l), {hidden, q_rows}, kLinear);
    layer.mlp_norm = load_weight(backend, store, names.weight(kFfnNorm, l), {hidden}, kOther);
    const std::vector<std::string> gate_up_names{names.weight(kFfnGate, l), names.weight(kFfnUp, l)};
    const std::vector<std::vector<int64_t>> gate_up_shapes{{hp.intermediate_size, hidden}, {hp.intermediate_size, hidden}};
    if (options.fuse_gate_up) {
      // For the epilogue the backend keeps the stacked weight in the row order its linear_silu_mul reads.
      layer.gate_up = sharded.stacked_rows(gate_up_names, gate_up_shapes, "model.layers." + std::to_string(l) + ".gate_up",
                                           options.gate_up_epilogue ? WeightUse::kGateUpSiluMul : kLinear);
    } else {
      layer.gate_proj = sharded.rows(gate_up_names[0], gate_up_shapes[0], kLinear);
      layer.up_proj = sharded.rows(gate_up_names[1], gate_up_shapes[1], kLinear);
    }
    layer.down = sharded.columns(names.weight(kFfnDown, l), {hidden, hp.intermediate_size}, kLinear);
    w.layers.push_back(std::move(layer));
  }
  w.final_norm = load_weight(backend, store, names.weight(kOutputNorm), {hidden}, kOther);
  const std::string lm_head = names.weight(kOutput);
  const TensorShard vocab_part = lm_head_shard(hp, options, shard);
  if (store.contains(lm_head)) {
    w.lm_head = ShardedLoader(store, backend, vocab_part).rows(lm_head, {hp.vocab_size, hidden}, kOther);
  } else {
    TESSERA_CHECK(hp.tie_word_embeddings, "weights have no " << lm_head
                                                             << " and the config does not tie word embeddings");
    // A rank's part of a tied lm_head is loaded on its own: the embedding stays whole for lookups.
    w.lm_head = vocab_part.split() ? ShardedLoader(store, backend, vocab_part)
                                         .rows(names.weight(kTokenEmbedding), {hp.vocab_size, hidden}, kOther)
                                   : w.token_embedding;
  }

  kernels::RopeFrequencyParams rope;
  rope.head_dim = hp.head_dim;
  rope.theta = hp.rope_theta;
  rope.llama3 = hp.rope_scaling.kind == RopeScaling::Kind::kLlama3;
  rope.factor = hp.rope_scaling.factor;
  rope.low_freq_factor = hp.rope_scaling.low_freq_factor;
  rope.high_freq_factor = hp.rope_scaling.high_freq_factor;
  rope.original_max_position_embeddings = static_cast<double>(hp.rope_scaling.original_max_position_embeddings);
  std::vector<float> inv_freq(hp.head_dim / 2);
  TESSERA_CHECK(kernels::rope_inv_freqs(rope, inv_freq.data()),
                "rope parameters (theta " << hp.rope_theta << ", scaling factor " << rope.factor << ", low/high freq factors "
                                          << rope.low_freq_factor << "/" << rope.high_freq_factor << ") are invalid");
  w.rope_inv_freq = backend.upload(inv_freq, {hp.head_dim / 2}, "rope.inv_freq");
  return w;
}

TensorShard lm_head_shard(const LlamaHyperParams& hp, const GraphOptions& options, const TensorShard& shard) {
  if (!options.split_lm_head || hp.vocab_size % shard.size != 0) return {};
  return shard;
}

// ---------------------------------------------------------------- graph

LlamaModel::LlamaModel(ModelConfig config, const WeightStore& store, Backend& backend, const GraphOptions& options)
    : config_(std::move(config)),
      shard_(TensorShard::of(backend)),
      hp_(LlamaHyperParams::from_config(config_).sharded(shard_)),
      lm_head_shard_(lm_head_shard(hp_, options, shard_)),
      backend_(backend),
      options_(options),
      weights_((options.check_backend(backend),
                LlamaWeights::load(LlamaHyperParams::from_config(config_), store, backend, options, shard_))) {}

void LlamaModel::add_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  if (options_.fuse_add_rms_norm) {
    if (shard_.split()) {
      backend_.all_reduce_add_rms_norm(x, residual, w, eps);
    } else {
      backend_.add_rms_norm(x, residual, w, eps);
    }
    return;
  }
  if (shard_.split()) backend_.all_reduce(x);
  backend_.add(x, residual);
  backend_.rms_norm(residual, w, eps, x);
}

Tensor LlamaModel::forward(const ForwardBatch& batch, KvCacheStorage* cache, std::span<const int32_t> logit_rows,
                           const TensorObserver* observer) {
  TESSERA_CHECK(batch.plan != nullptr, "llama forward: no attention plan");
  const AttentionPlan& plan = *batch.plan;
  const int64_t n = plan.total_q();
  TESSERA_CHECK(static_cast<int64_t>(batch.token_ids.size()) == n,
                "llama forward: " << batch.token_ids.size() << " token ids for a plan of " << n << " tokens");
  Backend& be = backend_;
  const QkvLayout layout{hp_.num_heads, hp_.num_kv_heads, hp_.head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim));
  const float eps = hp_.rms_norm_eps;
  auto emit = [&](Tensor& t, const std::string& name) {
    t.set_name(name);
    if (observer != nullptr && *observer) (*observer)(t);
  };

  const Tensor ids = batch.ids_on(be);
  Tensor residual = be.empty({n, hp_.hidden_size}, be.activation_type(), "residual");  // the residual stream
  Tensor x = be.empty({n, hp_.hidden_size}, be.activation_type(), "x");                // normed input of each block
  Tensor qkv = be.empty({n, layout.row_width()}, be.activation_type(), "qkv");
  Tensor attn = be.empty({n, static_cast<int64_t>(hp_.num_heads) * hp_.head_dim}, be.activation_type(), "attn");
  // With the epilogue, linear_silu_mul writes act straight from x: no gate_up activation.
  Tensor gate_up;
  if (!options_.gate_up_epilogue) gate_up = be.empty({n, 2 * hp_.intermediate_size}, be.activation_type(), "gate_up");
  Tensor act = be.empty({n, hp_.intermediate_size}, be.activation_type(), "act");
  // The unfused projections' outputs, joined by column into qkv / gate_up for the ops that read them.
  Tensor q, k, v, gate, up;
  if (!options_.fuse_qkv) {
    q = be.empty({n, static_cast<int64_t>(hp_.num_heads) * hp_.head_dim}, be.activation_type(), "q");
    k = be.empty({n, static_cast<int64_t>(hp_.num_kv_heads) * hp_.head_dim}, be.activation_type(), "k");
    v = be.empty({n, static_cast<int64_t>(hp_.num_kv_heads) * hp_.head_dim}, be.activation_type(), "v");
  }
  if (!options_.fuse_gate_up) {
    gate = be.empty({n, hp_.intermediate_size}, be.activation_type(), "gate");
    up = be.empty({n, hp_.intermediate_size}, be.activation_type(), "up");
  }

  be.embedding(ids, weights_.token_embedding, residual, /*accumulate=*/false);
  emit(residual, "embed");
  be.rms_norm(residual, weights_.layers[0].attn_norm, eps, x);
  emit(x, "blk.0.attn_norm");
  for (int64_t l = 0; l < hp_.num_layers; ++l) {
    const LlamaLayerWeights& w = weights_.layers[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    if (options_.fuse_qkv) {
      be.linear(x, w.qkv, w.qkv_bias.defined() ? &w.qkv_bias : nullptr, qkv);
    } else {
      const Tensor* bias_parts[3] = {nullptr, nullptr, nullptr};
      Tensor bias_q, bias_k, bias_v;
      if (w.qkv_bias.defined()) {  // the fused bias split into its q, k and v rows
        bias_q = w.qkv_bias.rows(layout.q_offset(), q.dim(1));
        bias_k = w.qkv_bias.rows(layout.k_offset(), k.dim(1));
        bias_v = w.qkv_bias.rows(layout.v_offset(), v.dim(1));
        bias_parts[0] = &bias_q, bias_parts[1] = &bias_k, bias_parts[2] = &bias_v;
      }
      be.linear(x, w.q_proj, bias_parts[0], q);
      be.linear(x, w.k_proj, bias_parts[1], k);
      be.linear(x, w.v_proj, bias_parts[2], v);
      const Tensor* parts[] = {&q, &k, &v};
      be.concat_columns(parts, qkv);
    }
    emit(qkv, blk + "qkv");
    if (options_.rope_in_kv_write) {
      // q rotated in place, K rotated on its way into the cache (qkv's k columns stay unrotated when
      // there is a cache): no qkv_rope tensor to observe.
      be.rope_attention(qkv, layout, weights_.rope_inv_freq, scale, plan, cache, l, attn);
    } else {
      be.rope(qkv, layout, weights_.rope_inv_freq, plan);
      emit(qkv, blk + "qkv_rope");
      be.attention(qkv, layout, scale, plan, cache, l, attn);
    }
    emit(attn, blk + "attn");
    be.linear(attn, w.o_proj, nullptr, x);
    emit(x, blk + "attn_out");  // on one rank of several, its partial sum
    add_norm(x, residual, w.mlp_norm, eps);  // residual += attn_out; x = norm(residual)
    emit(residual, blk + "attn_residual");
    emit(x, blk + "mlp_norm");
    if (options_.gate_up_epilogue) {
      be.linear_silu_mul(x, w.gate_up, act);
    } else {
      if (options_.fuse_gate_up) {
        be.linear(x, w.gate_up, nullptr, gate_up);
      } else {
        be.linear(x, w.gate_proj, nullptr, gate);
        be.linear(x, w.up_proj, nullptr, up);
        const Tensor* parts[] = {&gate, &up};
        be.concat_columns(parts, gate_up);
      }
      be.silu_mul(gate_up, act);
    }
    emit(act, blk + "mlp_act");
    be.linear(act, w.down, nullptr, x);
    emit(x, blk + "mlp_out");  // on one rank of several, its partial sum
    // Fuses this block's residual add with the next block's input norm (or the final norm).
    const bool last = l + 1 == hp_.num_layers;
    add_norm(x, residual, last ? weights_.final_norm : weights_.layers[l + 1].attn_norm, eps);
    emit(residual, blk + "out");
    emit(x, last ? std::string("output_norm") : "blk." + std::to_string(l + 1) + ".attn_norm");
  }
  Tensor last_hidden = be.empty({static_cast<int64_t>(logit_rows.size()), hp_.hidden_size}, be.activation_type(),
                                "logit_rows");
  be.gather_rows(x, logit_rows, last_hidden);
  Tensor logits = logits_of(last_hidden);
  emit(logits, "logits");
  return logits;
}

Tensor LlamaModel::logits_of(const Tensor& hidden) {
  Backend& be = backend_;
  const int64_t rows = hidden.dim(0);
  Tensor logits = be.empty({rows, hp_.vocab_size}, be.activation_type(), "logits");
  if (!lm_head_shard_.split()) {
    be.linear(hidden, weights_.lm_head, nullptr, logits);
    return logits;
  }
  const int64_t ranks = lm_head_shard_.size;
  const int64_t part = lm_head_shard_.part(hp_.vocab_size);
  Tensor mine = be.empty({rows, part}, be.activation_type(), "logits_part");
  be.linear(hidden, weights_.lm_head, nullptr, mine);
  if (rows == 1) {  // rank r's part is columns [r * part, (r + 1) * part) of the one row: gather in place
    Tensor by_rank = logits.reshaped({ranks, part});
    be.all_gather(mine, by_rank);
    return logits;
  }
  Tensor by_rank = be.empty({ranks * rows, part}, be.activation_type(), "logits_parts");
  be.all_gather(mine, by_rank);
  std::vector<Tensor> parts;
  std::vector<const Tensor*> columns;
  for (int64_t r = 0; r < ranks; ++r) parts.push_back(by_rank.rows(r * rows, rows));
  for (const Tensor& p : parts) columns.push_back(&p);
  be.concat_columns(columns, logits);
  return logits;
}

}  // namespace tessera
