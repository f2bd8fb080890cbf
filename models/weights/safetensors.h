// models/weights/safetensors.h: safetensors reader: mmap, single file or sharded
// (model.safetensors.index.json). Tensors keep their names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/weights/weight_store.h"

namespace tessera {

// `path` is a .safetensors file, a model.safetensors.index.json, or a directory holding either.
// Throws tessera::Error naming the file and tensor on bad headers, offsets past the end,
// size/shape mismatches and unknown dtypes.
WeightStore load_safetensors(const std::string& path);

// Parses one in-memory safetensors image into `store` (used by the fuzzer and tests).
void parse_safetensors(std::shared_ptr<const std::vector<std::byte>> image, const std::string& name,
                       WeightStore& store);

}  // namespace tessera
