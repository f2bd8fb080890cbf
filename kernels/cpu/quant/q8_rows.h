// kernels/cpu/quant/q8_rows.h: activation rows quantized on the fly for the integer matmuls, per
// block of 32 values with one fp32 scale, at one of two precisions:
//   8-bit   as llama.cpp quantizes activations for its q8 dot products: d = max|x| / 127 and int8
//           quants q = round(x / d).
//   16-bit  d = max|x| / 32512 and integers t = round(x / d), |t| <= 32512, stored as two int8
//           digits t = 255 * q + q_lo with q = round(t / 255) and |q|, |q_lo| <= 127. The digits go
//           through the very int8 dot-product instructions and weight layouts of the 8-bit path (two
//           dot products per weight chunk instead of one), and every digit stays inside the operand
//           ranges the AVX2 pair and vpdpbusd need without saturation (|digit| <= 127).
// One error source only: each value moves by at most d / 2 (the tests bound matmul error by it).
// 8-bit activations cost SmolLM2 3.4 points of top-1 agreement with the fp32 path; 16-bit gives them
// back (bench/NOTES.md).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::kernels::cpu {

// Activation precision of the block-format matmuls.
enum class ActivationBits : int32_t { k8 = 8, k16 = 16 };

// 16-bit activations: the largest |t| and the digit base (t = kDigitBase * q + q_lo).
inline constexpr int32_t kActivation16Max = 32512;  // 127 * 255 + 127: the high digit stays <= 127
inline constexpr int32_t kDigitBase = 255;

struct Q8Rows {
  int64_t rows = 0;
  int64_t k = 0;       // values per row, a multiple of 32
  int64_t blocks = 0;  // k / 32
  // [rows, k], each row 32-byte aligned: the int8 quants (8-bit), the high digits (16-bit)
  int8_t* q = nullptr;
  // [rows, k] like q: the low digits (16-bit), in q's array right after its rows * k high digits;
  // nullptr for 8-bit activations
  int8_t* q_lo = nullptr;
  float* d = nullptr;    // [rows, blocks] scales
  // [blocks, rows] (block-major, so a tile reads its rows' values of a block in one load; 4 floats
  // of padding after) d * sum(t), t the block's integers (q for 8-bit, 255 q + q_lo for 16-bit): the
  // nibble formats' offset / minimum term needs it
  float* s = nullptr;
  // [blocks, rows] (block-major as s) sum(t) as an integer: the interleaved kernels start a block's
  // integer dot product at -8 sum(t) (q4_0x8) or -128 sum(t) (q8_0x8, whose quants are stored + 128),
  // which keeps the weight offset exact.
  int32_t* sums = nullptr;

  bool sixteen_bit() const { return q_lo != nullptr; }
};

// Owns the memory of a Q8Rows; reused across calls so a decode step allocates nothing.
class Q8Buffer {
 public:
  Q8Rows& reserve(int64_t rows, int64_t k, ActivationBits bits);

 private:
  std::vector<int8_t> quants_;
  std::vector<float> scales_;
  std::vector<int32_t> sums_;
  Q8Rows view_;
};

}  // namespace tessera::kernels::cpu
