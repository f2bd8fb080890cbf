// models/graph_weights.h: the store's named weights handed to a backend as a graph loads them (shared
// by every graph).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend/backend.h"
#include "models/weights/weight_store.h"

namespace tessera {

// `use`: kLinear for a layer's projection matrices (the backend may quantize them), kOther for
// embeddings, the lm_head, norms and biases (Backend::load_weight).
Tensor load_weight(Backend& backend, const WeightStore& store, const std::string& name, std::vector<int64_t> shape,
                   WeightUse use);
// The named weights stacked along rows into one tensor called `fused_name` (Backend::load_stacked).
Tensor load_stacked(Backend& backend, const WeightStore& store, std::span<const std::string> names,
                    std::span<const std::vector<int64_t>> shapes, std::string fused_name, WeightUse use);

}  // namespace tessera
