// kernels/cpu/quant/q8_rows.cpp: Q8Buffer (the quantization itself is per ISA, in kernels_*.cpp).
#include "kernels/cpu/quant/q8_rows.h"

#include <cstddef>

namespace tessera::kernels::cpu {
namespace {

// Rows of k (a multiple of 32) bytes stay 32-byte aligned when the first one is.
int8_t* aligned_start(std::vector<int8_t>& bytes, size_t needed) {
  if (bytes.size() < needed + 64) bytes.resize(needed + 64);
  const auto base = reinterpret_cast<uintptr_t>(bytes.data());
  return reinterpret_cast<int8_t*>((base + 63) & ~static_cast<uintptr_t>(63));
}

}  // namespace

Q8Rows& Q8Buffer::reserve(int64_t rows, int64_t k, ActivationBits bits) {
  const int64_t blocks = k / 32;
  const auto quant_bytes = static_cast<size_t>(rows * k);
  const auto scale_count = static_cast<size_t>(2 * rows * blocks + 4);  // s is read 4 rows at a time
  if (scales_.size() < scale_count) scales_.resize(scale_count);
  if (sums_.size() < static_cast<size_t>(rows * blocks)) sums_.resize(static_cast<size_t>(rows * blocks));
  // 16-bit: the low digits right after the high ones, in the same array, so a kernel reaches a
  // row's low digits at one fixed offset from its high digits (one register for all rows of a tile).
  const bool wide = bits == ActivationBits::k16;
  view_.q = aligned_start(quants_, wide ? 2 * quant_bytes : quant_bytes);
  view_.q_lo = wide ? view_.q + quant_bytes : nullptr;
  view_.rows = rows;
  view_.k = k;
  view_.blocks = blocks;
  view_.d = scales_.data();
  view_.s = scales_.data() + rows * blocks;
  view_.sums = sums_.data();
  return view_;
}

}  // namespace tessera::kernels::cpu
