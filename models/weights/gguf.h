// models/weights/gguf.h: GGUF v2/v3 reader: header, every metadata value type, tensor infos,
// alignment. Memory-maps the file; tensor bytes are views into the map.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "models/weights/weight_store.h"

namespace tessera {

struct GgufValue;
using GgufArray = std::vector<GgufValue>;
struct GgufValue {
  // uint8..int64, float32/64 and bool are widened; arrays hold any of these (nested arrays too).
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;
};

struct GgufTensorInfo {
  std::string name;             // GGUF name, e.g. "blk.0.attn_q.weight"
  uint32_t ggml_type = 0;       // raw ggml type id
  std::vector<uint64_t> dims;   // GGUF order: dims[0] is the fastest-varying (ne0)
  uint64_t offset = 0;          // relative to the data section
};

// ggml's name for a raw type id ("Q4_1", "F32", ...); "unknown" for ids outside ggml's table.
const char* ggml_type_name(uint32_t ggml_type);

class GgufFile {
 public:
  // Throws tessera::Error naming the file (and the key or tensor) on any malformed content.
  static GgufFile open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer and tests); `name` is used in messages.
  static GgufFile parse(std::shared_ptr<const std::vector<std::byte>> image, const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  bool has(const std::string& key) const;
  // Typed getters throw naming the key when it is missing or of another type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;  // any integer type
  double get_float(const std::string& key) const;  // any float or integer type
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::optional<std::string> find_string(const std::string& key) const;
  std::optional<int64_t> find_int(const std::string& key) const;
  std::optional<double> find_float(const std::string& key) const;

  // Builds a WeightStore under HF tensor names (blk.N.attn_q.weight ->
  // model.layers.N.self_attn.q_proj.weight, ...), with llama.cpp's RoPE row permutation of
  // attn_q/attn_k undone (on the raw rows, so quantized bytes stay usable). The store keeps the
  // mapping alive.
  WeightStore to_weight_store() const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::shared_ptr<const void> owner_;  // the mapping or buffer
  const std::byte* data_ = nullptr;    // start of the data section
  size_t data_size_ = 0;
};

}  // namespace tessera
