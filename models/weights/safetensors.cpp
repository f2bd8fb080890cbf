// models/weights/safetensors.cpp: safetensors reader. Layout: u64 little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data buffer that the offsets index.
#include "models/weights/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/weights/mapped_file.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::optional<DType> dtype_from_safetensors(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "F64") return DType::kF64;
  if (s == "I8") return DType::kI8;
  if (s == "I16") return DType::kI16;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  if (s == "U8") return DType::kU8;
  if (s == "BOOL") return DType::kBool;
  return std::nullopt;
}

// Reads a non-negative JSON integer that fits in int64; nullopt otherwise.
std::optional<int64_t> json_index(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

// A value for an error message: scalars as written (cut to 64 characters), containers by kind,
// so a hostile header never makes the message huge or recurse deeply.
std::string brief(const nlohmann::json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " values";
  if (v.is_object()) return "an object";
  std::string text = v.dump();
  if (text.size() > 64) text = text.substr(0, 64) + "...";
  return text;
}

struct Span {
  uint64_t begin, end;
  std::string name;
};

void parse_image(std::shared_ptr<const void> owner, const std::byte* data, size_t size, const std::string& file,
                 WeightStore& store) {
  if (size < 8) TESSERA_FAIL(file << ": not a safetensors file: " << size << " bytes, shorter than the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, data, sizeof header_len);
  if (header_len > size - 8) {
    TESSERA_FAIL(file << ": header length " << header_len << " runs past the end of the file (" << size << " bytes)");
  }
  const auto* header_begin = reinterpret_cast<const char*>(data + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_len);
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL(file << ": bad JSON header: " << e.what());
  }
  if (!header.is_object()) TESSERA_FAIL(file << ": bad JSON header: expected an object, got " << header.type_name());

  const std::byte* buffer = data + 8 + header_len;
  const uint64_t buffer_size = size - 8 - header_len;
  std::vector<Span> spans;
  std::vector<WeightView> tensors;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;  // free-form string map; nothing we need
    const std::string where = file + ": tensor '" + name + "'";
    if (!info.is_object()) TESSERA_FAIL(where << ": expected an object with dtype, shape and data_offsets");
    auto dtype_it = info.find("dtype");
    if (dtype_it == info.end() || !dtype_it->is_string()) TESSERA_FAIL(where << ": missing string field 'dtype'");
    const auto dtype_text = dtype_it->get<std::string>();
    const std::optional<DType> dtype = dtype_from_safetensors(dtype_text);
    if (!dtype) {
      TESSERA_FAIL(where << ": unsupported dtype '" << dtype_text
                         << "' (supported: F32, F16, BF16, F64, I8, I16, I32, I64, U8, BOOL)");
    }
    auto shape_it = info.find("shape");
    if (shape_it == info.end() || !shape_it->is_array()) TESSERA_FAIL(where << ": missing array field 'shape'");
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (const auto& dim : *shape_it) {
      const std::optional<int64_t> d = json_index(dim);
      if (!d) TESSERA_FAIL(where << ": shape entry " << brief(dim) << " is not a non-negative integer");
      if (*d != 0 && numel > std::numeric_limits<int64_t>::max() / *d) {
        TESSERA_FAIL(where << ": shape has too many elements (overflow at entry " << shape.size() << ", " << *d << ")");
      }
      numel *= *d;
      shape.push_back(*d);
    }
    auto offsets_it = info.find("data_offsets");
    if (offsets_it == info.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      TESSERA_FAIL(where << ": 'data_offsets' must be an array [begin, end]");
    }
    const std::optional<int64_t> begin = json_index((*offsets_it)[0]);
    const std::optional<int64_t> end = json_index((*offsets_it)[1]);
    if (!begin || !end || *begin > *end) {
      TESSERA_FAIL(where << ": data_offsets [" << brief((*offsets_it)[0]) << ", " << brief((*offsets_it)[1])
                         << "] are not an increasing pair of byte offsets");
    }
    if (static_cast<uint64_t>(*end) > buffer_size) {
      TESSERA_FAIL(where << ": data_offsets " << offsets_it->dump() << " run past the end of the data ("
                         << buffer_size << " bytes)");
    }
    size_t expected = 0;
    try {
      expected = dtype_row_bytes(*dtype, numel);
    } catch (const Error& e) {
      TESSERA_FAIL(where << ": " << e.what());
    }
    const auto stored = static_cast<uint64_t>(*end - *begin);
    if (stored != expected) {
      TESSERA_FAIL(where << ": data_offsets " << offsets_it->dump() << " hold " << stored << " bytes, but shape "
                         << shape_it->dump() << " of " << dtype_text << " needs " << expected);
    }
    spans.push_back({static_cast<uint64_t>(*begin), static_cast<uint64_t>(*end), name});
    WeightView t;
    t.name = name;
    t.dtype = *dtype;
    t.shape = std::move(shape);
    t.bytes = std::span<const std::byte>(buffer + *begin, stored);
    t.source_file = file;
    tensors.push_back(std::move(t));
  }
  // Tensors must not share bytes (zero-sized ones cannot overlap anything).
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Span* previous = nullptr;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (previous != nullptr && s.begin < previous->end) {
      TESSERA_FAIL(file << ": tensor '" << s.name << "' (bytes " << s.begin << ".." << s.end << ") overlaps tensor '"
                        << previous->name << "' (bytes " << previous->begin << ".." << previous->end << ")");
    }
    previous = &s;
  }
  store.keep_alive(std::move(owner));
  for (WeightView& t : tensors) store.add(std::move(t));
}

void load_file(const std::string& path, WeightStore& store) {
  std::shared_ptr<const MappedFile> map = MappedFile::open(path);
  const std::byte* data = map->data();
  const size_t size = map->size();
  parse_image(std::move(map), data, size, path, store);
}

void load_index(const std::string& index_path, WeightStore& store) {
  std::ifstream in(index_path);
  if (!in) TESSERA_FAIL(index_path << ": cannot open");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL(index_path << ": bad JSON: " << e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    TESSERA_FAIL(index_path << ": expected an object with a 'weight_map' object");
  }
  const fs::path dir = fs::path(index_path).parent_path();
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) TESSERA_FAIL(index_path << ": weight_map entry for tensor '" << tensor << "' is not a file name");
    const auto shard_name = shard.get<std::string>();
    if (shard_name.empty() || fs::path(shard_name).is_absolute() || shard_name.find("..") != std::string::npos) {
      TESSERA_FAIL(index_path << ": weight_map entry for tensor '" << tensor << "' names shard '" << shard_name
                              << "' outside the model folder");
    }
    shards.insert(shard_name);
  }
  if (shards.empty()) TESSERA_FAIL(index_path << ": weight_map is empty");
  for (const std::string& shard : shards) load_file((dir / shard).string(), store);
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    if (!store.contains(tensor)) {
      TESSERA_FAIL(index_path << ": tensor '" << tensor << "' is mapped to shard '" << shard.get<std::string>()
                              << "', which does not contain it");
    }
    const std::string expected_file = (dir / shard.get<std::string>()).string();
    if (store.get(tensor).source_file != expected_file) {
      TESSERA_FAIL(index_path << ": tensor '" << tensor << "' is mapped to '" << expected_file << "' but was found in '"
                              << store.get(tensor).source_file << "'");
    }
  }
}

}  // namespace

void parse_safetensors(std::shared_ptr<const std::vector<std::byte>> image, const std::string& name,
                       WeightStore& store) {
  TESSERA_CHECK(image != nullptr, name << ": no image");
  const std::byte* data = image->data();
  const size_t size = image->size();
  parse_image(std::move(image), data, size, name, store);
}

WeightStore load_safetensors(const std::string& path) {
  WeightStore store;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors.index.json")) {
      load_index((dir / "model.safetensors.index.json").string(), store);
      return store;
    }
    if (fs::exists(dir / "model.safetensors")) {
      load_file((dir / "model.safetensors").string(), store);
      return store;
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".safetensors") found.push_back(entry.path().string());
    }
    if (found.size() != 1) {
      TESSERA_FAIL(path << ": expected model.safetensors.index.json, model.safetensors or exactly one .safetensors file; found "
                        << found.size() << " .safetensors files");
    }
    load_file(found[0], store);
    return store;
  }
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    load_index(path, store);
  } else {
    load_file(path, store);
  }
  return store;
}

}  // namespace tessera
