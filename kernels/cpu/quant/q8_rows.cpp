// kernels/cpu/quant/q8_rows.cpp: Q8Buffer (the quantization itself is per ISA, in kernels_*.cpp).
#include "kernels/cpu/quant/q8_rows.h"

#include <cstddef>

namespace tessera::kernels::cpu {

Q8Rows& Q8Buffer::reserve(int64_t rows, int64_t k) {
  const int64_t blocks = k / 32;
  const auto quant_bytes = static_cast<size_t>(rows * k);
  if (quants_.size() < quant_bytes + 64) quants_.resize(quant_bytes + 64);
  const auto scale_count = static_cast<size_t>(2 * rows * blocks + 4);  // s is read 4 rows at a time
  if (scales_.size() < scale_count) scales_.resize(scale_count);
  if (sums_.size() < static_cast<size_t>(rows * blocks)) sums_.resize(static_cast<size_t>(rows * blocks));
  // Rows of k (a multiple of 32) bytes stay 32-byte aligned when the first one is.
  const auto base = reinterpret_cast<uintptr_t>(quants_.data());
  view_.q = reinterpret_cast<int8_t*>((base + 63) & ~static_cast<uintptr_t>(63));
  view_.rows = rows;
  view_.k = k;
  view_.blocks = blocks;
  view_.d = scales_.data();
  view_.s = scales_.data() + rows * blocks;
  view_.sums = sums_.data();
  return view_;
}

}  // namespace tessera::kernels::cpu
