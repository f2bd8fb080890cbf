// models/weights/requantize.h: converts a store's weight matrices to another storage format (fp32,
// fp16, bf16, or GGUF's Q8_0 / Q4_0 / Q4_1 blocks) before a backend loads them: the tuner's and a
// profile's `weight_format` on formats the file does not hold. Quantization follows ggml's reference
// rounding, so a requantized Q8_0 matches what llama.cpp's converter writes from the same values.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kernels/backend/weight_view.h"
#include "models/weights/weight_store.h"

namespace tessera {

// The format names of the tuner's space and of profiles: "f32", "f16", "bf16", "q8_0", "q4_0",
// "q4_1"; nullopt for anything else ("gguf"/"native" means the file's own format, no conversion).
std::optional<DType> weight_format_from_name(std::string_view name);

// How precise a format is, for picking the reference candidate: f32 4, f16/bf16 3, q8_0 2, q4_1 1,
// q4_0 0.
int weight_format_rank(DType dtype);

// Every 2-D float tensor (projections, embeddings, lm_head) converted to `target`; vectors (norms,
// biases) and non-float tensors stay as they are. A matrix whose rows a block format cannot hold
// (columns not a multiple of 32) keeps its format. The source store is kept alive by the result.
WeightStore requantize_weights(WeightStore source, DType target);

// One row of `count` fp32 values into `target`'s bytes (count a multiple of 32 for block formats).
void quantize_row(DType target, const float* src, int64_t count, std::byte* dst);

}  // namespace tessera
