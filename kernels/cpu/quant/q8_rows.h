// kernels/cpu/quant/q8_rows.h: activation rows quantized on the fly for the integer matmuls, as
// llama.cpp quantizes activations for its q8 dot products: each block of 32 values gets an fp32
// scale d = max|x| / 127 and int8 quants q = round(x / d). One error source only: each value moves
// by at most d / 2 (the tests bound matmul error by it).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::kernels::cpu {

struct Q8Rows {
  int64_t rows = 0;
  int64_t k = 0;       // values per row, a multiple of 32
  int64_t blocks = 0;  // k / 32
  int8_t* q = nullptr;   // [rows, k], each row 32-byte aligned
  float* d = nullptr;    // [rows, blocks] scales
  // [blocks, rows] (block-major, so a tile reads its rows' values of a block in one load; 4 floats
  // of padding after) d * sum(q): the nibble formats' offset / minimum term needs it
  float* s = nullptr;
  // [blocks, rows] (block-major as s) sum(q) as an integer: the interleaved kernels start a block's
  // integer dot product at -8 sum(q) (q4_0x8) or -128 sum(q) (q8_0x8, whose quants are stored + 128),
  // which keeps the weight offset exact.
  int32_t* sums = nullptr;
};

// Owns the memory of a Q8Rows; reused across calls so a decode step allocates nothing.
class Q8Buffer {
 public:
  Q8Rows& reserve(int64_t rows, int64_t k);

 private:
  std::vector<int8_t> quants_;
  std::vector<float> scales_;
  std::vector<int32_t> sums_;
  Q8Rows view_;
};

}  // namespace tessera::kernels::cpu
