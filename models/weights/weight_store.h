// models/weights/weight_store.h: one store of named weight tensors, keyed by HF tensor names,
// whatever file format they came from. Model code only ever sees this.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend/weight_view.h"

namespace tessera {

// Const calls are thread-safe (the store is read-only once built); building (keep_alive, add) is not.
class WeightStore {
 public:
  WeightStore();
  ~WeightStore();
  WeightStore(WeightStore&&) noexcept;
  WeightStore& operator=(WeightStore&&) noexcept;

  bool contains(const std::string& name) const;
  // Throws tessera::Error naming the tensor (and the files searched) when absent.
  const WeightView& get(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const;
  std::map<std::string, size_t> count_by_dtype() const;  // dtype name -> tensor count

  // Converts (dequantizes) any float or quantized tensor to fp32, row-major in `shape` order.
  // Throws naming the tensor for non-float dtypes.
  std::vector<float> to_f32(const std::string& name) const;

  // --- building (used by the readers) ---
  // Keeps `owner` (an mmap, a buffer) alive as long as the store.
  void keep_alive(std::shared_ptr<const void> owner);
  // Throws on a duplicate name.
  void add(WeightView tensor);

 private:
  std::map<std::string, WeightView> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
};

}  // namespace tessera
