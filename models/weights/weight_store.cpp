// models/weights/weight_store.cpp: WeightStore, dtype sizes and fp32 conversion / dequantization.
#include "models/weights/weight_store.h"

#include "common/error.h"

namespace tessera {
WeightStore::WeightStore() = default;
WeightStore::~WeightStore() = default;
WeightStore::WeightStore(WeightStore&&) noexcept = default;
WeightStore& WeightStore::operator=(WeightStore&&) noexcept = default;

bool WeightStore::contains(const std::string& name) const { return tensors_.count(name) != 0; }

const WeightView& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::string files;
    for (const auto& [_, t] : tensors_) {
      if (files.find(t.source_file) == std::string::npos) files += (files.empty() ? "" : ", ") + t.source_file;
    }
    TESSERA_FAIL("tensor '" << name << "' not found (" << tensors_.size() << " tensors in "
                            << (files.empty() ? std::string("no files") : files) << ")");
  }
  return it->second;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, _] : tensors_) out.push_back(name);
  return out;
}

size_t WeightStore::size() const { return tensors_.size(); }

std::map<std::string, size_t> WeightStore::count_by_dtype() const {
  std::map<std::string, size_t> counts;
  for (const auto& [_, t] : tensors_) ++counts[dtype_name(t.dtype)];
  return counts;
}

std::vector<float> WeightStore::to_f32(const std::string& name) const { return get(name).to_f32(); }

void WeightStore::keep_alive(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }

void WeightStore::add(WeightView tensor) {
  auto it = tensors_.find(tensor.name);
  if (it != tensors_.end()) {
    TESSERA_FAIL("duplicate tensor '" << tensor.name << "' in " << tensor.source_file << " (already read from "
                                      << it->second.source_file << ")");
  }
  std::string name = tensor.name;
  tensors_.emplace(std::move(name), std::move(tensor));
}

}  // namespace tessera
