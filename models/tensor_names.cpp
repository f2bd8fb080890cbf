// models/tensor_names.cpp: names from the tensor table, HF and GGUF.
#include "models/tensor_names.h"

#include <optional>
#include <string_view>

#include "common/error.h"

namespace tessera {
namespace {

constexpr std::string_view kLayer = "{L}";

const char* part_suffix(TensorPart part) { return part == TensorPart::kWeight ? ".weight" : ".bias"; }

// "model.layers.{L}.x" with layer "3" -> "model.layers.3.x"; names without "{L}" are kept.
std::string with_layer(std::string_view pattern, std::string_view layer) {
  std::string name(pattern);
  const size_t at = name.find(kLayer);
  if (at != std::string::npos) name.replace(at, kLayer.size(), layer);
  return name;
}

// The layer digits when `name` is `pattern` with "{L}" standing for them ("" for a name without
// "{L}" equal to the pattern); nullopt when it is not.
std::optional<std::string_view> match_layer(std::string_view pattern, std::string_view name) {
  const size_t at = pattern.find(kLayer);
  if (at == std::string_view::npos) return pattern == name ? std::optional<std::string_view>("") : std::nullopt;
  const std::string_view before = pattern.substr(0, at), after = pattern.substr(at + kLayer.size());
  if (name.size() <= before.size() + after.size() || !name.starts_with(before) || !name.ends_with(after)) {
    return std::nullopt;
  }
  const std::string_view layer = name.substr(before.size(), name.size() - before.size() - after.size());
  for (char c : layer) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return layer;
}

}  // namespace

const TensorNameRow& tensor_name_row(Architecture arch, TensorKind kind) {
  for (const TensorNameRow& row : tensor_table::kRows) {
    if (row.arch == table_architecture(arch) && row.kind == kind) return row;
  }
  TESSERA_FAIL("a " << architecture_name(arch) << " model has no tensor of kind " << static_cast<int>(kind));
}

TensorNames::TensorNames(Architecture arch, std::string prefix) : arch_(arch), prefix_(std::move(prefix)) {}

std::string TensorNames::name(TensorKind kind, TensorPart part, int64_t layer) const {
  const TensorNameRow& row = tensor_name_row(arch_, kind);
  TESSERA_CHECK(row.presence(part) != Presence::kAbsent,
                "a " << architecture_name(arch_) << " model has no " << row.hf << part_suffix(part));
  const bool per_layer = std::string_view(row.hf).find(kLayer) != std::string_view::npos;
  TESSERA_CHECK(!per_layer || layer >= 0, "tensor name " << row.hf << " needs a layer index");
  return prefix_ + with_layer(row.hf, std::to_string(layer)) + part_suffix(part);
}

std::string gguf_to_hf_tensor_name(const std::string& gguf_name) {
  const size_t dot = gguf_name.rfind('.');
  if (dot == std::string::npos) return gguf_name;
  const std::string_view base = std::string_view(gguf_name).substr(0, dot);
  const std::string_view suffix = std::string_view(gguf_name).substr(dot);
  for (const TensorNameRow& row : tensor_table::kRows) {
    if (row.arch != Architecture::kLlama) continue;
    for (TensorPart part : {TensorPart::kWeight, TensorPart::kBias}) {
      if (row.presence(part) == Presence::kAbsent || suffix != part_suffix(part)) continue;
      if (const std::optional<std::string_view> layer = match_layer(row.gguf, base)) {
        return with_layer(row.hf, *layer) + part_suffix(part);
      }
    }
  }
  return gguf_name;
}

}  // namespace tessera
