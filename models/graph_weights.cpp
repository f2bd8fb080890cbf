// models/graph_weights.cpp: store -> backend weight loading for the graphs.
#include "models/graph_weights.h"

namespace tessera {

Tensor load_weight(Backend& backend, const WeightStore& store, const std::string& name, std::vector<int64_t> shape,
                   WeightUse use) {
  return backend.load_weight(store.get(name), std::move(shape), use);
}

Tensor load_stacked(Backend& backend, const WeightStore& store, std::span<const std::string> names,
                    std::span<const std::vector<int64_t>> shapes, std::string fused_name, WeightUse use) {
  std::vector<const WeightView*> parts;
  for (const std::string& name : names) parts.push_back(&store.get(name));
  return backend.load_stacked(parts, shapes, std::move(fused_name), use);
}

}  // namespace tessera
