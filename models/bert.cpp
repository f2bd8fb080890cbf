// models/bert.cpp: BERT hyper-parameters, weight loading and the encoder graph.
#include "models/bert.h"

#include <cmath>

#include "common/error.h"
#include "models/graph_weights.h"
#include "models/tensor_names.h"

namespace tessera {

// ---------------------------------------------------------------- hyper-parameters

BertHyperParams BertHyperParams::from_config(const ModelConfig& c) {
  TESSERA_CHECK(c.arch == Architecture::kBert, c.source << ": a " << architecture_name(c.arch) << " model is not BERT");
  TESSERA_CHECK(c.num_layers >= 1, c.source << ": num_hidden_layers must be >= 1, got " << c.num_layers);
  TESSERA_CHECK(c.num_heads >= 1 && c.head_dim >= 1 && c.num_heads * c.head_dim == c.hidden_size,
                c.source << ": num_attention_heads (" << c.num_heads << ") x head_dim (" << c.head_dim
                         << ") must equal hidden_size (" << c.hidden_size << ")");
  TESSERA_CHECK(c.max_position_embeddings >= 1,
                c.source << ": max_position_embeddings must be >= 1, got " << c.max_position_embeddings);
  TESSERA_CHECK(c.hidden_act.empty() || c.hidden_act == "gelu",
                c.source << ": hidden_act \"" << c.hidden_act << "\" is not supported (expected \"gelu\")");
  BertHyperParams hp;
  hp.num_layers = c.num_layers;
  hp.hidden_size = c.hidden_size;
  hp.intermediate_size = c.intermediate_size;
  hp.num_heads = static_cast<int32_t>(c.num_heads);
  hp.head_dim = static_cast<int32_t>(c.head_dim);
  hp.vocab_size = c.vocab_size;
  hp.max_position_embeddings = c.max_position_embeddings;
  hp.type_vocab_size = c.type_vocab_size;
  hp.layer_norm_eps = static_cast<float>(c.norm_eps);
  hp.pooling = c.pooling == Pooling::kNone ? Pooling::kMean : c.pooling;
  hp.normalize = c.normalize_embeddings;
  return hp;
}

// ---------------------------------------------------------------- tensors

namespace {

// Token type 0 is every token's type when a forward names none, as the embedding engine's do. Adding
// its row to the position table once at load makes such a forward two lookups, with nothing to upload
// but its ids (a captured forward may not upload).
Tensor fold_type0(const BertHyperParams& hp, const BertWeights& w, Backend& backend) {
  const int64_t rows = hp.max_position_embeddings;
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (int32_t p = 0; p < rows; ++p) positions[static_cast<size_t>(p)] = p;
  const std::vector<int32_t> type0(static_cast<size_t>(rows), 0);
  Tensor folded = backend.empty({rows, hp.hidden_size}, backend.activation_type(), "position_with_type0");
  backend.embedding(backend.upload(positions, {rows}, "positions"), w.position_embedding, folded, false);
  backend.embedding(backend.upload(type0, {rows}, "token_types"), w.token_type_embedding, folded, true);
  return folded;
}

}  // namespace

BertWeights BertWeights::load(const BertHyperParams& hp, const WeightStore& store, Backend& backend) {
  // BertForX checkpoints nest the encoder under "bert."; sentence-transformers' do not.
  using enum TensorKind;
  const bool nested = store.contains(TensorNames(Architecture::kBert, "bert.").weight(kTokenEmbedding));
  const std::string prefix = nested ? "bert." : "";
  const TensorNames names(Architecture::kBert, prefix);
  const int64_t h = hp.hidden_size;
  // Only the layers' linear matrices are kLinear: the embedding tables stay unquantized.
  constexpr WeightUse kLinear = WeightUse::kLinear;
  constexpr WeightUse kOther = WeightUse::kOther;
  BertWeights w;
  w.word_embedding = load_weight(backend, store, names.weight(kTokenEmbedding), {hp.vocab_size, h}, kOther);
  w.position_embedding =
      load_weight(backend, store, names.weight(kPositionEmbedding), {hp.max_position_embeddings, h}, kOther);
  const std::string token_types = names.weight(kTokenTypeEmbedding);
  if (store.contains(token_types)) {
    TESSERA_CHECK(hp.type_vocab_size >= 1,
                  "weights have " << token_types << " but the config's type_vocab_size is 0");
    w.token_type_embedding = load_weight(backend, store, token_types, {hp.type_vocab_size, h}, kOther);
  }
  if (w.token_type_embedding.defined()) w.position_with_type0 = fold_type0(hp, w, backend);
  w.embedding_norm_w = load_weight(backend, store, names.weight(kEmbeddingNorm), {h}, kOther);
  w.embedding_norm_b = load_weight(backend, store, names.bias(kEmbeddingNorm), {h}, kOther);
  for (int64_t l = 0; l < hp.num_layers; ++l) {
    BertLayerWeights layer;
    const std::string tag = prefix + "encoder.layer." + std::to_string(l);
    const std::vector<std::string> qkv{names.weight(kAttnQ, l), names.weight(kAttnK, l), names.weight(kAttnV, l)};
    const std::vector<std::vector<int64_t>> qkv_shapes{{h, h}, {h, h}, {h, h}};
    layer.qkv = load_stacked(backend, store, qkv, qkv_shapes, tag + ".qkv", kLinear);
    const std::vector<std::string> qkv_bias{names.bias(kAttnQ, l), names.bias(kAttnK, l), names.bias(kAttnV, l)};
    const std::vector<std::vector<int64_t>> bias_shapes{{h}, {h}, {h}};
    layer.qkv_bias = load_stacked(backend, store, qkv_bias, bias_shapes, tag + ".qkv_bias", kOther);
    layer.attn_out = load_weight(backend, store, names.weight(kAttnOut, l), {h, h}, kLinear);
    layer.attn_out_bias = load_weight(backend, store, names.bias(kAttnOut, l), {h}, kOther);
    layer.attn_norm_w = load_weight(backend, store, names.weight(kAttnOutNorm, l), {h}, kOther);
    layer.attn_norm_b = load_weight(backend, store, names.bias(kAttnOutNorm, l), {h}, kOther);
    layer.inter = load_weight(backend, store, names.weight(kFfnUp, l), {hp.intermediate_size, h}, kLinear);
    layer.inter_bias = load_weight(backend, store, names.bias(kFfnUp, l), {hp.intermediate_size}, kOther);
    layer.out = load_weight(backend, store, names.weight(kFfnDown, l), {h, hp.intermediate_size}, kLinear);
    layer.out_bias = load_weight(backend, store, names.bias(kFfnDown, l), {h}, kOther);
    layer.out_norm_w = load_weight(backend, store, names.weight(kLayerOutNorm, l), {h}, kOther);
    layer.out_norm_b = load_weight(backend, store, names.bias(kLayerOutNorm, l), {h}, kOther);
    w.layers.push_back(std::move(layer));
  }
  return w;
}

// ---------------------------------------------------------------- graph

BertModel::BertModel(ModelConfig config, const WeightStore& store, Backend& backend)
    : config_(std::move(config)), hp_(BertHyperParams::from_config(config_)), backend_(backend),
      weights_(BertWeights::load(hp_, store, backend)) {}

Tensor BertModel::encode(const ForwardBatch& batch, const TensorObserver* observer) {
  TESSERA_CHECK(batch.plan != nullptr, "bert encode: no attention plan");
  const AttentionPlan& plan = *batch.plan;
  TESSERA_CHECK(!plan.paged(), "bert encode: an encoder has no KV cache; plan without one");
  const int64_t n = plan.total_q();
  TESSERA_CHECK(static_cast<int64_t>(batch.token_ids.size()) == n,
                "bert encode: " << batch.token_ids.size() << " token ids for a plan of " << n << " tokens");
  TESSERA_CHECK(batch.token_type_ids.empty() || static_cast<int64_t>(batch.token_type_ids.size()) == n,
                "bert encode: " << batch.token_type_ids.size() << " token type ids for " << n << " tokens");
  for (int32_t len : plan.kv_lens()) {
    TESSERA_CHECK(len <= hp_.max_position_embeddings, "bert encode: a sequence of " << len
                                                          << " tokens exceeds max_position_embeddings "
                                                          << hp_.max_position_embeddings);
  }
  Backend& be = backend_;
  const int64_t h = hp_.hidden_size;
  const QkvLayout layout{hp_.num_heads, hp_.num_heads, hp_.head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim));
  const float eps = hp_.layer_norm_eps;
  auto emit = [&](Tensor& t, const std::string& name) {
    t.set_name(name);
    if (observer != nullptr && *observer) (*observer)(t);
  };

  Tensor hidden = be.empty({n, h}, be.activation_type(), "hidden");
  Tensor other = be.empty({n, h}, be.activation_type(), "other");
  Tensor qkv = be.empty({n, 3 * h}, be.activation_type(), "qkv");
  Tensor attn = be.empty({n, h}, be.activation_type(), "attn");
  Tensor inter = be.empty({n, hp_.intermediate_size}, be.activation_type(), "inter");

  be.embedding(batch.ids_on(be), weights_.word_embedding, hidden, false);
  const bool typed = weights_.token_type_embedding.defined() && !batch.token_type_ids.empty();
  const Tensor& positions_table = weights_.position_with_type0.defined() && !typed ? weights_.position_with_type0
                                                                                   : weights_.position_embedding;
  be.embedding(be.step_positions(plan), positions_table, hidden, true);
  if (typed) {
    be.embedding(be.upload(batch.token_type_ids, {n}, "token_type_ids"), weights_.token_type_embedding, hidden, true);
  }
  be.layer_norm(hidden, nullptr, weights_.embedding_norm_w, weights_.embedding_norm_b, eps);
  emit(hidden, "embed");
  for (int64_t l = 0; l < hp_.num_layers; ++l) {
    const BertLayerWeights& w = weights_.layers[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    be.linear(hidden, w.qkv, &w.qkv_bias, qkv);
    emit(qkv, blk + "qkv");
    be.attention(qkv, layout, scale, plan, nullptr, l, attn);
    emit(attn, blk + "attn");
    be.linear(attn, w.attn_out, &w.attn_out_bias, other);
    be.layer_norm(other, &hidden, w.attn_norm_w, w.attn_norm_b, eps);  // post-LN: LN(attn_out + hidden)
    std::swap(hidden, other);
    emit(hidden, blk + "attn_norm");
    be.linear(hidden, w.inter, &w.inter_bias, inter);
    be.gelu(inter);
    emit(inter, blk + "mlp_act");
    be.linear(inter, w.out, &w.out_bias, other);
    be.layer_norm(other, &hidden, w.out_norm_w, w.out_norm_b, eps);
    std::swap(hidden, other);
    emit(hidden, blk + "out");
  }
  emit(hidden, "last_hidden_state");
  return hidden;
}

Tensor BertModel::embed(const ForwardBatch& batch, const TensorObserver* observer) {
  Tensor hidden = encode(batch, observer);
  const AttentionPlan& plan = *batch.plan;
  Tensor pooled = backend_.empty({plan.num_seqs(), hp_.hidden_size}, backend_.activation_type(), "pooled");
  backend_.pool(hidden, plan, hp_.pooling == Pooling::kCls ? PoolMode::kCls : PoolMode::kMean, pooled);
  if (hp_.normalize) backend_.l2_normalize(pooled);
  pooled.set_name("embedding");
  if (observer != nullptr && *observer) (*observer)(pooled);
  return pooled;
}

}  // namespace tessera
