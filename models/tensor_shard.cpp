// models/tensor_shard.cpp: the weight slices of a tensor-parallel rank.
#include "models/tensor_shard.h"

#include <cstring>

#include "common/error.h"

namespace tessera {

namespace {

std::string part_name(const WeightView& weight, const char* what, int64_t begin, int64_t count) {
  return weight.name + " (" + what + " " + std::to_string(begin) + ".." + std::to_string(begin + count) + ")";
}

}  // namespace

WeightView weight_rows(const WeightView& weight, int64_t begin, int64_t count) {
  TESSERA_CHECK(!weight.shape.empty() && weight.shape.size() <= 2 && begin >= 0 && count >= 1 &&
                    begin + count <= weight.shape[0],
                "weight " << weight.name << " " << shape_string(weight.shape) << ": no rows [" << begin << ", "
                          << begin + count << ")");
  const int64_t cols = weight.shape.size() == 2 ? weight.shape[1] : 1;
  const size_t row_bytes = dtype_row_bytes(weight.dtype, cols);
  TESSERA_CHECK(weight.bytes.size() == row_bytes * static_cast<size_t>(weight.shape[0]),
                "weight " << weight.name << " in " << weight.source_file << ": " << weight.bytes.size()
                          << " bytes do not hold " << shape_string(weight.shape));
  WeightView part = weight;
  part.shape[0] = count;
  part.bytes = weight.bytes.subspan(row_bytes * static_cast<size_t>(begin), row_bytes * static_cast<size_t>(count));
  part.name = part_name(weight, "rows", begin, count);
  return part;
}

WeightView weight_columns(const WeightView& weight, int64_t begin, int64_t count, std::vector<std::byte>& storage) {
  TESSERA_CHECK(weight.shape.size() == 2 && begin >= 0 && count >= 1 && begin + count <= weight.shape[1],
                "weight " << weight.name << " " << shape_string(weight.shape) << ": no columns [" << begin << ", "
                          << begin + count << ")");
  const int64_t rows = weight.shape[0];
  const size_t row_bytes = dtype_row_bytes(weight.dtype, weight.shape[1]);
  TESSERA_CHECK(weight.bytes.size() == row_bytes * static_cast<size_t>(rows),
                "weight " << weight.name << " in " << weight.source_file << ": " << weight.bytes.size()
                          << " bytes do not hold " << shape_string(weight.shape));
  // Whole blocks on either side (dtype_row_bytes throws naming the dtype otherwise).
  const size_t skip = dtype_row_bytes(weight.dtype, begin);
  const size_t take = dtype_row_bytes(weight.dtype, count);
  storage.resize(take * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(storage.data() + take * static_cast<size_t>(r),
                weight.bytes.data() + row_bytes * static_cast<size_t>(r) + skip, take);
  }
  WeightView part = weight;
  part.shape[1] = count;
  part.bytes = storage;
  part.name = part_name(weight, "columns", begin, count);
  return part;
}

}  // namespace tessera
