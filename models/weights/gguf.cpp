// models/weights/gguf.cpp: GGUF v2/v3 reader. Layout: magic "GGUF", u32 version, u64 tensor count,
// u64 metadata count, metadata (key string, u32 type, value), tensor infos (name, u32 n_dims,
// u64 dims[n_dims], u32 ggml type, u64 offset), padding to general.alignment, data section.
// Strings are u64 length + bytes; arrays are u32 element type + u64 count + elements.
#include "models/weights/gguf.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <limits>
#include <set>

#include "common/error.h"
#include "models/tensor_names.h"
#include "models/weights/mapped_file.h"

namespace tessera {
namespace {

enum GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;           // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;        // deeper nesting is no real file; bounds recursion

struct GgmlTypeTraits {
  const char* name;
  uint32_t block_values;  // 0: unknown id
  uint32_t block_bytes;
};

// Block sizes of every ggml type id, so any file's tensor sizes can be checked even for types we
// do not dequantize.
GgmlTypeTraits ggml_traits(uint32_t type) {
  static constexpr std::array<GgmlTypeTraits, 42> kTraits = {{
      {"F32", 1, 4}, {"F16", 1, 2}, {"Q4_0", 32, 18}, {"Q4_1", 32, 20}, {"Q4_2", 0, 0}, {"Q4_3", 0, 0},
      {"Q5_0", 32, 22}, {"Q5_1", 32, 24}, {"Q8_0", 32, 34}, {"Q8_1", 32, 40}, {"Q2_K", 256, 84},
      {"Q3_K", 256, 110}, {"Q4_K", 256, 144}, {"Q5_K", 256, 176}, {"Q6_K", 256, 210}, {"Q8_K", 256, 292},
      {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
      {"IQ4_NL", 32, 18}, {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82}, {"IQ4_XS", 256, 136}, {"I8", 1, 1},
      {"I16", 1, 2}, {"I32", 1, 4}, {"I64", 1, 8}, {"F64", 1, 8}, {"IQ1_M", 256, 56}, {"BF16", 1, 2},
      {"Q4_0_4_4", 0, 0}, {"Q4_0_4_8", 0, 0}, {"Q4_0_8_8", 0, 0}, {"TQ1_0", 256, 54}, {"TQ2_0", 256, 66},
      {"IQ4_NL_4_4", 0, 0}, {"IQ4_NL_4_8", 0, 0}, {"IQ4_NL_8_8", 0, 0}, {"MXFP4", 32, 17},
      {"NVFP4", 64, 36}, {"Q1_0", 128, 18},
  }};
  if (type >= kTraits.size()) return {"unknown", 0, 0};
  const GgmlTypeTraits t = kTraits[type];
  return t.block_values == 0 ? GgmlTypeTraits{"unknown", 0, 0} : t;
}

std::optional<DType> dtype_from_ggml(uint32_t type) {
  switch (type) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 8: return DType::kQ8_0;
    case 24: return DType::kI8;
    case 25: return DType::kI16;
    case 26: return DType::kI32;
    case 27: return DType::kI64;
    case 28: return DType::kF64;
    case 30: return DType::kBF16;
    default: return std::nullopt;
  }
}

const char* value_type_name(uint32_t type) {
  switch (type) {
    case kU8: return "uint8"; case kI8: return "int8"; case kU16: return "uint16"; case kI16: return "int16";
    case kU32: return "uint32"; case kI32: return "int32"; case kF32: return "float32"; case kBool: return "bool";
    case kString: return "string"; case kArray: return "array"; case kU64: return "uint64";
    case kI64: return "int64"; case kF64: return "float64";
    default: return "unknown";
  }
}

// Smallest encoding of one value of `type`: bounds array counts before anything is allocated.
uint64_t min_value_bytes(uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: case kString: return 8;
    case kArray: return 12;
    default: return 1;
  }
}

// Bounds-checked little-endian reads over the image; every failure names the file and what was read.
class Cursor {
 public:
  Cursor(const std::byte* data, size_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  void need(uint64_t bytes, const std::string& what) const {
    if (bytes > remaining()) {
      TESSERA_FAIL(file_ << ": truncated: " << what << " needs " << bytes << " bytes at offset " << pos_ << ", but only "
                         << remaining() << " remain");
    }
  }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    const auto length = read<uint64_t>(what + " (string length)");
    need(length, what + " (string of " + std::to_string(length) + " bytes)");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return s;
  }

 private:
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& file_;
};

// float32 metadata as the double nearest its shortest decimal form (1e-05f reads as 1e-05, not
// 9.99999974e-06), so values compare equal to the ones in the HF config the file came from.
double widen_f32(float f) {
  char text[64];
  const std::to_chars_result written = std::to_chars(text, text + sizeof text, f);
  double d = f;
  std::from_chars(text, written.ptr, d);  // locale-independent; leaves d as is on failure
  return d;
}

GgufValue read_value(Cursor& in, uint32_t type, const std::string& key, const std::string& file, int depth) {
  const std::string what = "value of metadata key '" + key + "'";
  GgufValue v;
  switch (type) {
    case kU8: v.value = uint64_t{in.read<uint8_t>(what)}; break;
    case kI8: v.value = int64_t{in.read<int8_t>(what)}; break;
    case kU16: v.value = uint64_t{in.read<uint16_t>(what)}; break;
    case kI16: v.value = int64_t{in.read<int16_t>(what)}; break;
    case kU32: v.value = uint64_t{in.read<uint32_t>(what)}; break;
    case kI32: v.value = int64_t{in.read<int32_t>(what)}; break;
    case kU64: v.value = in.read<uint64_t>(what); break;
    case kI64: v.value = in.read<int64_t>(what); break;
    case kF32: v.value = widen_f32(in.read<float>(what)); break;
    case kF64: v.value = in.read<double>(what); break;
    case kBool: v.value = in.read<uint8_t>(what) != 0; break;
    case kString: v.value = in.read_string(what); break;
    case kArray: {
      if (depth >= kMaxArrayNesting) {
        TESSERA_FAIL(file << ": metadata key '" << key << "': arrays nested deeper than " << kMaxArrayNesting);
      }
      const auto element_type = in.read<uint32_t>(what + " (array element type)");
      if (element_type > kF64) {
        TESSERA_FAIL(file << ": metadata key '" << key << "': unknown array element type " << element_type);
      }
      const auto count = in.read<uint64_t>(what + " (array length)");
      // Reject counts the remaining bytes cannot hold before reserving anything.
      if (count > in.remaining() / min_value_bytes(element_type)) {
        TESSERA_FAIL(file << ": metadata key '" << key << "': array of " << count << " " << value_type_name(element_type)
                          << " values cannot fit in the " << in.remaining() << " bytes left");
      }
      GgufArray items;
      items.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i) items.push_back(read_value(in, element_type, key, file, depth + 1));
      v.value = std::move(items);
      break;
    }
    default:
      TESSERA_FAIL(file << ": metadata key '" << key << "' has unknown value type " << type);
  }
  return v;
}

const char* held_type_name(const GgufValue& v) {
  switch (v.value.index()) {
    case 0: return "an unsigned integer";
    case 1: return "a signed integer";
    case 2: return "a float";
    case 3: return "a bool";
    case 4: return "a string";
    default: return "an array";
  }
}

std::optional<int64_t> as_int(const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v.value)) return *i;
  return std::nullopt;
}

std::optional<double> as_float(const GgufValue& v) {
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v.value)) return static_cast<double>(*i);
  return std::nullopt;
}

bool is_attn_qk(const std::string& gguf_name, bool* is_q) {
  // blk.N.attn_q.weight / .bias and blk.N.attn_k.weight / .bias
  if (gguf_name.rfind("blk.", 0) != 0) return false;
  for (const char* suffix : {".attn_q.weight", ".attn_q.bias", ".attn_k.weight", ".attn_k.bias"}) {
    const size_t n = std::strlen(suffix);
    if (gguf_name.size() > n && gguf_name.compare(gguf_name.size() - n, n, suffix) == 0) {
      *is_q = suffix[6] == 'q';
      return true;
    }
  }
  return false;
}

}  // namespace

const char* ggml_type_name(uint32_t ggml_type) { return ggml_traits(ggml_type).name; }

namespace {

struct ParsedGguf {
  uint32_t version = 0;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;
  size_t data_offset = 0;
  size_t data_size = 0;
};

ParsedGguf parse_image(const std::byte* data, size_t size, const std::string& file) {
  ParsedGguf out;
  Cursor in(data, size, file);
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) TESSERA_FAIL(file << ": not a GGUF file (bad magic)");
  in.read<uint32_t>("magic");
  out.version = in.read<uint32_t>("version");
  if (out.version != 2 && out.version != 3) {
    TESSERA_FAIL(file << ": GGUF version " << out.version << " is not supported (expected 2 or 3"
                      << (out.version == 1 ? "; version 1 predates 64-bit counts" : "")
                      << (out.version > 0xffff ? "; a big-endian file?" : "") << ")");
  }
  const auto tensor_count = in.read<uint64_t>("tensor count");
  const auto kv_count = in.read<uint64_t>("metadata count");
  // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info 8+4+8+4+8.
  if (kv_count > in.remaining() / 13) {
    TESSERA_FAIL(file << ": metadata count " << kv_count << " cannot fit in the " << in.remaining() << " bytes left");
  }
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = in.read_string("key of metadata entry " + std::to_string(i));
    const auto type = in.read<uint32_t>("type of metadata key '" + key + "'");
    GgufValue value = read_value(in, type, key, file, 0);
    if (!out.metadata.emplace(key, std::move(value)).second) TESSERA_FAIL(file << ": duplicate metadata key '" << key << "'");
  }

  uint64_t alignment = kDefaultAlignment;
  if (auto it = out.metadata.find("general.alignment"); it != out.metadata.end()) {
    const std::optional<int64_t> a = as_int(it->second);
    if (!a || *a <= 0 || (*a & (*a - 1)) != 0 || *a > (int64_t{1} << 30)) {
      TESSERA_FAIL(file << ": metadata key 'general.alignment' must be a power of two, got "
                        << (a ? std::to_string(*a) : std::string(held_type_name(it->second))));
    }
    alignment = static_cast<uint64_t>(*a);
  }

  if (tensor_count > in.remaining() / 32) {
    TESSERA_FAIL(file << ": tensor count " << tensor_count << " cannot fit in the " << in.remaining() << " bytes left");
  }
  std::vector<uint64_t> tensor_bytes;
  std::set<std::string> tensor_names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = in.read_string("name of tensor " + std::to_string(i));
    const std::string where = file + ": tensor '" + t.name + "'";
    const auto n_dims = in.read<uint32_t>("dimension count of tensor '" + t.name + "'");
    if (n_dims == 0 || n_dims > kMaxDims) TESSERA_FAIL(where << ": " << n_dims << " dimensions (expected 1 to " << kMaxDims << ")");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = in.read<uint64_t>("dimensions of tensor '" + t.name + "'");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim)) {
        TESSERA_FAIL(where << ": dimension " << d << " = " << dim << " makes the element count overflow");
      }
      numel *= dim;
      t.dims.push_back(dim);
    }
    t.ggml_type = in.read<uint32_t>("type of tensor '" + t.name + "'");
    t.offset = in.read<uint64_t>("offset of tensor '" + t.name + "'");
    const GgmlTypeTraits traits = ggml_traits(t.ggml_type);
    if (traits.block_values == 0) TESSERA_FAIL(where << ": unknown ggml type " << t.ggml_type);
    if (t.dims[0] % traits.block_values != 0) {
      TESSERA_FAIL(where << ": row length " << t.dims[0] << " is not a multiple of the " << traits.block_values
                         << "-value blocks of " << traits.name);
    }
    if (t.offset % alignment != 0) {
      TESSERA_FAIL(where << ": offset " << t.offset << " is not a multiple of the alignment " << alignment);
    }
    const uint64_t blocks = numel / traits.block_values;
    if (blocks > std::numeric_limits<uint64_t>::max() / traits.block_bytes) {
      TESSERA_FAIL(where << ": byte size overflows");
    }
    tensor_bytes.push_back(blocks * traits.block_bytes);
    if (!tensor_names.insert(t.name).second) TESSERA_FAIL(where << ": duplicate tensor name");
    out.tensors.push_back(std::move(t));
  }

  const uint64_t header_end = in.pos();
  const uint64_t data_offset = (header_end + alignment - 1) / alignment * alignment;
  if (data_offset > size) {
    if (!out.tensors.empty()) {
      TESSERA_FAIL(file << ": truncated: the data section starts at offset " << data_offset << ", past the end of the file ("
                        << size << " bytes)");
    }
    out.data_offset = size;
    out.data_size = 0;
    return out;
  }
  out.data_offset = static_cast<size_t>(data_offset);
  out.data_size = size - out.data_offset;

  // Tensors must lie inside the data section and not share bytes.
  std::vector<size_t> order(out.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const GgufTensorInfo& t = out.tensors[i];
    if (t.offset > out.data_size || tensor_bytes[i] > out.data_size - t.offset) {
      TESSERA_FAIL(file << ": tensor '" << t.name << "': bytes " << t.offset << ".." << t.offset + tensor_bytes[i]
                        << " of the data section run past its end (" << out.data_size << " bytes)");
    }
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return out.tensors[a].offset < out.tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = out.tensors[order[k - 1]];
    const GgufTensorInfo& cur = out.tensors[order[k]];
    if (tensor_bytes[order[k - 1]] != 0 && tensor_bytes[order[k]] != 0 &&
        cur.offset < prev.offset + tensor_bytes[order[k - 1]]) {
      TESSERA_FAIL(file << ": tensor '" << cur.name << "' at data offset " << cur.offset << " overlaps tensor '" << prev.name
                        << "' (bytes " << prev.offset << ".." << prev.offset + tensor_bytes[order[k - 1]] << ")");
    }
  }
  return out;
}

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
  std::shared_ptr<const MappedFile> map = MappedFile::open(path);
  ParsedGguf parsed = parse_image(map->data(), map->size(), path);
  GgufFile f;
  f.path_ = path;
  f.version_ = parsed.version;
  f.metadata_ = std::move(parsed.metadata);
  f.tensors_ = std::move(parsed.tensors);
  f.data_ = map->data() == nullptr ? nullptr : map->data() + parsed.data_offset;
  f.data_size_ = parsed.data_size;
  f.owner_ = std::move(map);
  return f;
}

GgufFile GgufFile::parse(std::shared_ptr<const std::vector<std::byte>> image, const std::string& name) {
  TESSERA_CHECK(image != nullptr, name << ": no image");
  ParsedGguf parsed = parse_image(image->data(), image->size(), name);
  GgufFile f;
  f.path_ = name;
  f.version_ = parsed.version;
  f.metadata_ = std::move(parsed.metadata);
  f.tensors_ = std::move(parsed.tensors);
  f.data_ = image->empty() ? nullptr : image->data() + parsed.data_offset;
  f.data_size_ = parsed.data_size;
  f.owner_ = std::move(image);
  return f;
}

bool GgufFile::has(const std::string& key) const { return metadata_.count(key) != 0; }

namespace {
const GgufValue& require(const std::map<std::string, GgufValue>& md, const std::string& key, const std::string& file) {
  auto it = md.find(key);
  if (it == md.end()) TESSERA_FAIL(file << ": metadata key '" << key << "' is missing");
  return it->second;
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = require(metadata_, key, path_);
  if (const auto* s = std::get_if<std::string>(&v.value)) return *s;
  TESSERA_FAIL(path_ << ": metadata key '" << key << "' is " << held_type_name(v) << ", expected a string");
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = require(metadata_, key, path_);
  if (std::optional<int64_t> i = as_int(v)) return *i;
  TESSERA_FAIL(path_ << ": metadata key '" << key << "' is " << held_type_name(v) << ", expected an integer below 2^63");
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = require(metadata_, key, path_);
  if (std::optional<double> d = as_float(v)) return *d;
  TESSERA_FAIL(path_ << ": metadata key '" << key << "' is " << held_type_name(v) << ", expected a number");
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = require(metadata_, key, path_);
  if (const auto* b = std::get_if<bool>(&v.value)) return *b;
  TESSERA_FAIL(path_ << ": metadata key '" << key << "' is " << held_type_name(v) << ", expected a bool");
}

namespace {
const GgufArray& require_array(const std::map<std::string, GgufValue>& md, const std::string& key, const std::string& file) {
  const GgufValue& v = require(md, key, file);
  if (const auto* a = std::get_if<GgufArray>(&v.value)) return *a;
  TESSERA_FAIL(file << ": metadata key '" << key << "' is " << held_type_name(v) << ", expected an array");
}
}  // namespace

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufArray& a = require_array(metadata_, key, path_);
  std::vector<std::string> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto* s = std::get_if<std::string>(&a[i].value);
    if (s == nullptr) TESSERA_FAIL(path_ << ": metadata key '" << key << "'[" << i << "] is " << held_type_name(a[i]) << ", expected a string");
    out.push_back(*s);
  }
  return out;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufArray& a = require_array(metadata_, key, path_);
  std::vector<double> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::optional<double> d = as_float(a[i]);
    if (!d) TESSERA_FAIL(path_ << ": metadata key '" << key << "'[" << i << "] is " << held_type_name(a[i]) << ", expected a number");
    out.push_back(*d);
  }
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufArray& a = require_array(metadata_, key, path_);
  std::vector<int64_t> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::optional<int64_t> v = as_int(a[i]);
    if (!v) TESSERA_FAIL(path_ << ": metadata key '" << key << "'[" << i << "] is " << held_type_name(a[i]) << ", expected an integer");
    out.push_back(*v);
  }
  return out;
}

std::optional<std::string> GgufFile::find_string(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}

std::optional<int64_t> GgufFile::find_int(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_int(key);
}

std::optional<double> GgufFile::find_float(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}

WeightStore GgufFile::to_weight_store() const {
  WeightStore store;
  store.keep_alive(owner_);
  const bool llama = find_string("general.architecture").value_or("") == "llama";
  const std::optional<int64_t> n_head = llama ? find_int("llama.attention.head_count") : std::nullopt;
  const std::optional<int64_t> n_head_kv =
      llama ? (has("llama.attention.head_count_kv") ? find_int("llama.attention.head_count_kv") : n_head) : std::nullopt;

  for (const GgufTensorInfo& info : tensors_) {
    const std::optional<DType> dtype = dtype_from_ggml(info.ggml_type);
    if (!dtype) {
      TESSERA_FAIL(path_ << ": tensor '" << info.name << "' has ggml type " << ggml_type_name(info.ggml_type) << " ("
                         << info.ggml_type << "), which is not supported (F32, F16, BF16, F64, Q8_0, Q4_0, Q4_1, I8..I64)");
    }
    WeightView t;
    t.name = llama ? gguf_to_hf_tensor_name(info.name) : info.name;
    t.dtype = *dtype;
    t.shape.assign(info.dims.rbegin(), info.dims.rend());  // GGUF ne0 (fastest) is the HF last dim
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;  // overflow checked by the parser
    const size_t nbytes = dtype_row_bytes(*dtype, numel);
    t.bytes = std::span<const std::byte>(data_ + info.offset, nbytes);
    t.source_file = path_;

    bool is_q = false;
    if (llama && nbytes > 0 && is_attn_qk(info.name, &is_q)) {  // an empty tensor has no rows to move
      // llama.cpp's converter reordered each head's rows from [first half | second half] (HF's
      // rotate_half RoPE) to interleaved pairs: GGUF row h*hd + 2i + j holds HF row
      // h*hd + j*hd/2 + i. Move whole rows back, so quantized rows stay valid.
      const std::optional<int64_t> heads = is_q ? n_head : n_head_kv;
      const char* key = is_q ? "llama.attention.head_count" : "llama.attention.head_count_kv";
      if (!heads || *heads <= 0) {
        TESSERA_FAIL(path_ << ": tensor '" << info.name << "' needs metadata key '" << key << "' (> 0) to undo the RoPE row permutation");
      }
      const int64_t rows = t.shape[0];
      if (rows % *heads != 0 || (rows / *heads) % 2 != 0) {
        TESSERA_FAIL(path_ << ": tensor '" << info.name << "': " << rows << " rows do not split into " << *heads
                           << " heads of an even head dim (" << key << ")");
      }
      const int64_t head_dim = rows / *heads;
      const size_t row_bytes = rows == 0 ? 0 : nbytes / static_cast<size_t>(rows);
      auto unpermuted = std::make_shared<std::vector<std::byte>>(nbytes);
      for (int64_t h = 0; h < *heads; ++h) {
        for (int64_t i = 0; i < head_dim / 2; ++i) {
          for (int64_t j = 0; j < 2; ++j) {
            const int64_t src_row = h * head_dim + 2 * i + j;
            const int64_t dst_row = h * head_dim + j * (head_dim / 2) + i;
            std::memcpy(unpermuted->data() + static_cast<size_t>(dst_row) * row_bytes,
                        t.bytes.data() + static_cast<size_t>(src_row) * row_bytes, row_bytes);
          }
        }
      }
      t.bytes = std::span<const std::byte>(unpermuted->data(), unpermuted->size());
      store.keep_alive(std::move(unpermuted));
    }
    store.add(std::move(t));
  }
  return store;
}

}  // namespace tessera
