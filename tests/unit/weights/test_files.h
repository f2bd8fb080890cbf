// tests/unit/weights/test_files.h: builds small safetensors and GGUF images byte by byte for the
// reader tests (and the fuzz seed generator), so every test owns its inputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::test {

using Bytes = std::vector<std::byte>;

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_bytes(const Bytes& b) { bytes.insert(bytes.end(), b.begin(), b.end()); }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes.insert(bytes.end(), p, p + s.size());
  }
  void pad_to(size_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(std::byte{0});
  }
  Bytes bytes;
};

template <typename T>
Bytes to_bytes(const std::vector<T>& values) {
  Bytes out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// GGUF value type ids.
enum GgufType : uint32_t {
  kGgufU8 = 0, kGgufI8 = 1, kGgufU16 = 2, kGgufI16 = 3, kGgufU32 = 4, kGgufI32 = 5, kGgufF32 = 6,
  kGgufBool = 7, kGgufString = 8, kGgufArray = 9, kGgufU64 = 10, kGgufI64 = 11, kGgufF64 = 12,
};
// ggml tensor type ids.
enum GgmlType : uint32_t {
  kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ8_0 = 8, kGgmlQ4_K = 12,
  kGgmlI8 = 24, kGgmlI32 = 26, kGgmlF64 = 28, kGgmlBF16 = 30,
};

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;  // GGUF order (ne0 first)
    uint32_t type;
    Bytes data;
  };

  // Raw value: `value` already encoded for `type` (arrays included).
  void add_raw(const std::string& key, uint32_t type, const Bytes& value) {
    metadata_.put_string(key);
    metadata_.put<uint32_t>(type);
    metadata_.put_bytes(value);
    ++kv_count_;
  }
  template <typename T>
  void add(const std::string& key, uint32_t type, T value) {
    ByteWriter w;
    w.put<T>(value);
    add_raw(key, type, w.bytes);
  }
  void add_u32(const std::string& key, uint32_t v) { add(key, kGgufU32, v); }
  void add_f32(const std::string& key, float v) { add(key, kGgufF32, v); }
  void add_string(const std::string& key, const std::string& v) {
    ByteWriter w;
    w.put_string(v);
    add_raw(key, kGgufString, w.bytes);
  }
  void add_string_array(const std::string& key, const std::vector<std::string>& values) {
    ByteWriter w;
    w.put<uint32_t>(kGgufString);
    w.put<uint64_t>(values.size());
    for (const auto& v : values) w.put_string(v);
    add_raw(key, kGgufArray, w.bytes);
  }
  void add_tensor(Tensor t) { tensors_.push_back(std::move(t)); }

  uint32_t version = 3;
  uint64_t alignment = 32;  // must match general.alignment when the test sets that key

  Bytes build() const {
    ByteWriter w;
    w.bytes.insert(w.bytes.end(), {std::byte{'G'}, std::byte{'G'}, std::byte{'U'}, std::byte{'F'}});
    w.put<uint32_t>(version);
    w.put<uint64_t>(tensors_.size());
    w.put<uint64_t>(kv_count_);
    w.put_bytes(metadata_.bytes);
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      w.put_string(t.name);
      w.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) w.put<uint64_t>(d);
      w.put<uint32_t>(t.type);
      w.put<uint64_t>(offset);
      offsets.push_back(offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    w.pad_to(alignment);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      w.put_bytes(tensors_[i].data);
      if (i + 1 < tensors_.size()) w.pad_to(alignment);
    }
    return w.bytes;
  }

 private:
  ByteWriter metadata_;
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  Bytes data;
};

// A well-formed safetensors image of `entries`, laid out in order.
inline Bytes build_safetensors(const std::vector<SafetensorsEntry>& entries) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  Bytes data;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.data.size()}}};
    offset += e.data.size();
    data.insert(data.end(), e.data.begin(), e.data.end());
  }
  const std::string text = header.dump();
  ByteWriter w;
  w.put<uint64_t>(text.size());
  for (char c : text) w.put<char>(c);
  w.put_bytes(data);
  return w.bytes;
}

// A safetensors image with a hand-written header (for corrupt cases).
inline Bytes safetensors_with_header(const std::string& header, const Bytes& data) {
  ByteWriter w;
  w.put<uint64_t>(header.size());
  for (char c : header) w.put<char>(c);
  w.put_bytes(data);
  return w.bytes;
}

inline Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::shared_ptr<const Bytes> share(Bytes b) { return std::make_shared<const Bytes>(std::move(b)); }

inline void write_file(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("tessera-" + tag + "-" + std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace tessera::test
