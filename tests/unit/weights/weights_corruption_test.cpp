// tests/unit/weights/weights_corruption_test.cpp: malformed safetensors and GGUF images must give a
// tessera::Error naming the file and the tensor or key, never a crash or a huge allocation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "common/error.h"
#include "models/weights/gguf.h"
#include "models/weights/safetensors.h"
#include "tests/unit/weights/test_files.h"

namespace tessera {
namespace {

using test::Bytes;
using test::GgufBuilder;
using ::testing::HasSubstr;

// Runs `fn`, which must throw tessera::Error whose message holds every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << ::testing::PrintToString(parts);
  } catch (const Error& e) {
    for (const std::string& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

void parse_st(Bytes image, const std::string& name = "bad.safetensors") {
  WeightStore store;
  parse_safetensors(test::share(std::move(image)), name, store);
}

const Bytes kFourFloats = test::to_bytes(std::vector<float>{1, 2, 3, 4});

// ---------------------------------------------------------------------------------------------
// safetensors

TEST(SafetensorsCorrupt, TooShortForTheHeaderLength) {
  expect_error([] { parse_st(Bytes(5)); }, {"bad.safetensors", "8-byte header length"});
}

TEST(SafetensorsCorrupt, HeaderLengthPastTheEnd) {
  Bytes image = test::build_safetensors({{"w", "F32", {4}, kFourFloats}});
  image[7] = std::byte{0x7f};  // header length ~ 2^63
  expect_error([&] { parse_st(image); }, {"bad.safetensors", "header length", "past the end"});
}

TEST(SafetensorsCorrupt, BadJsonHeader) {
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"dtype": "F32", )", kFourFloats)); },
               {"bad.safetensors", "bad JSON header"});
  expect_error([] { parse_st(test::safetensors_with_header("[1, 2]", {})); }, {"bad.safetensors", "expected an object"});
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": 3})", {})); }, {"bad.safetensors", "'w'"});
}

TEST(SafetensorsCorrupt, MissingOrMistypedFieldsNameTheTensor) {
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"shape": [4], "data_offsets": [0, 16]}})", kFourFloats)); },
               {"bad.safetensors", "'w'", "dtype"});
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"dtype": "F32", "data_offsets": [0, 16]}})", kFourFloats)); },
               {"'w'", "shape"});
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"dtype": "F32", "shape": [4]}})", kFourFloats)); },
               {"'w'", "data_offsets"});
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", kFourFloats)); },
               {"'w'", "shape entry -4"});
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", kFourFloats)); },
               {"'w'", "increasing"});
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1.5]}})", kFourFloats)); },
               {"'w'", "data_offsets"});
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w.weight": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", kFourFloats)); },
               {"bad.safetensors", "'w.weight'", "unsupported dtype 'F8_E4M3'"});
}

TEST(SafetensorsCorrupt, OffsetsPastTheEnd) {
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w.weight": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", kFourFloats)); },
               {"bad.safetensors", "'w.weight'", "past the end"});
  expect_error([] {
    parse_st(test::safetensors_with_header(
        R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551615, 18446744073709551615]}})", kFourFloats));
  }, {"'w'"});
}

TEST(SafetensorsCorrupt, SizeDoesNotMatchShape) {
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w.weight": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", kFourFloats)); },
               {"bad.safetensors", "'w.weight'", "16 bytes", "needs 12"});
  expect_error([] { parse_st(test::safetensors_with_header(R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})", kFourFloats)); },
               {"'w'", "needs 8"});
  // An element count that overflows int64.
  expect_error([] {
    parse_st(test::safetensors_with_header(
        R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", kFourFloats));
  }, {"'w'", "too many elements"});
  // Fits int64 elements but not bytes.
  expect_error([] {
    parse_st(test::safetensors_with_header(
        R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 16]}})", kFourFloats));
  }, {"'w'"});
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  expect_error([] {
    parse_st(test::safetensors_with_header(
        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
        kFourFloats));
  }, {"bad.safetensors", "'b'", "overlaps", "'a'"});
}

TEST(SafetensorsCorrupt, TruncatedFilesAlwaysThrow) {
  const Bytes image = test::build_safetensors({{"a", "F32", {2}, test::to_bytes(std::vector<float>{1, 2})},
                                               {"b", "F16", {2}, test::to_bytes(std::vector<uint16_t>{1, 2})}});
  for (size_t len = 0; len < image.size(); ++len) {
    EXPECT_THROW(parse_st(Bytes(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(len))), Error) << len;
  }
  EXPECT_NO_THROW(parse_st(image));
}

// ---------------------------------------------------------------------------------------------
// GGUF

Bytes valid_gguf() {
  GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_string_array("tokenizer.ggml.tokens", {"a", "b"});
  b.add_tensor({"token_embd.weight", {4, 2}, test::kGgmlF32, test::to_bytes(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8})});
  b.add_tensor({"output_norm.weight", {4}, test::kGgmlF32, kFourFloats});
  return b.build();
}

GgufFile parse_gguf(Bytes image) { return GgufFile::parse(test::share(std::move(image)), "bad.gguf"); }

// A GGUF header (magic, version 3, counts) followed by `rest`.
Bytes gguf_with(uint64_t tensor_count, uint64_t kv_count, const Bytes& rest) {
  test::ByteWriter w;
  for (char c : std::string("GGUF")) w.put<char>(c);
  w.put<uint32_t>(3);
  w.put<uint64_t>(tensor_count);
  w.put<uint64_t>(kv_count);
  w.put_bytes(rest);
  return w.bytes;
}

TEST(GgufCorrupt, BadMagicAndVersion) {
  Bytes image = valid_gguf();
  image[0] = std::byte{'X'};
  expect_error([&] { parse_gguf(image); }, {"bad.gguf", "bad magic"});
  expect_error([] { parse_gguf(Bytes(2)); }, {"bad.gguf", "bad magic"});
  image = valid_gguf();
  image[4] = std::byte{1};
  expect_error([&] { parse_gguf(image); }, {"bad.gguf", "version 1"});
  image[4] = std::byte{9};
  expect_error([&] { parse_gguf(image); }, {"bad.gguf", "version 9"});
}

TEST(GgufCorrupt, TruncatedFilesAlwaysThrow) {
  const Bytes image = valid_gguf();
  EXPECT_NO_THROW(parse_gguf(image).to_weight_store());
  for (size_t len = 0; len < image.size(); ++len) {
    EXPECT_THROW(parse_gguf(Bytes(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(len))), Error) << len;
  }
}

TEST(GgufCorrupt, HugeStringLengthDoesNotAllocate) {
  test::ByteWriter kv;
  kv.put<uint64_t>(uint64_t{1} << 63);  // key length 2^63
  kv.put<uint32_t>(0);
  expect_error([&] { parse_gguf(gguf_with(0, 1, test::concat(kv.bytes, Bytes(64)))); }, {"bad.gguf", "9223372036854775808 bytes"});
  test::ByteWriter value;
  value.put_string("general.name");
  value.put<uint32_t>(test::kGgufString);
  value.put<uint64_t>(uint64_t{1} << 63);  // value length 2^63
  expect_error([&] { parse_gguf(gguf_with(0, 1, test::concat(value.bytes, Bytes(64)))); }, {"bad.gguf", "'general.name'", "9223372036854775808"});
  test::ByteWriter name;
  name.put<uint64_t>(~uint64_t{0});  // tensor name length 2^64-1
  expect_error([&] { parse_gguf(gguf_with(1, 0, test::concat(name.bytes, Bytes(40)))); }, {"bad.gguf", "name of tensor 0"});
}

TEST(GgufCorrupt, HugeCountsAreRejectedBeforeAllocating) {
  expect_error([] { parse_gguf(gguf_with(0, uint64_t{1} << 62, Bytes(64))); }, {"bad.gguf", "metadata count"});
  expect_error([] { parse_gguf(gguf_with(uint64_t{1} << 62, 0, Bytes(64))); }, {"bad.gguf", "tensor count"});
  test::ByteWriter arr;
  arr.put_string("tokenizer.ggml.tokens");
  arr.put<uint32_t>(test::kGgufArray);
  arr.put<uint32_t>(test::kGgufString);
  arr.put<uint64_t>(uint64_t{1} << 61);
  expect_error([&] { parse_gguf(gguf_with(0, 1, arr.bytes)); }, {"bad.gguf", "'tokenizer.ggml.tokens'", "cannot fit"});
}

TEST(GgufCorrupt, UnknownValueTypesAndDeepNesting) {
  test::ByteWriter bad_type;
  bad_type.put_string("general.x");
  bad_type.put<uint32_t>(13);
  bad_type.put<uint64_t>(0);
  expect_error([&] { parse_gguf(gguf_with(0, 1, bad_type.bytes)); }, {"bad.gguf", "'general.x'", "unknown value type 13"});
  test::ByteWriter bad_elem;
  bad_elem.put_string("general.y");
  bad_elem.put<uint32_t>(test::kGgufArray);
  bad_elem.put<uint32_t>(77);
  bad_elem.put<uint64_t>(1);
  expect_error([&] { parse_gguf(gguf_with(0, 1, bad_elem.bytes)); }, {"'general.y'", "element type 77"});
  test::ByteWriter deep;
  deep.put_string("general.deep");
  deep.put<uint32_t>(test::kGgufArray);
  for (int i = 0; i < 100; ++i) {
    deep.put<uint32_t>(test::kGgufArray);
    deep.put<uint64_t>(1);
  }
  expect_error([&] { parse_gguf(gguf_with(0, 1, test::concat(deep.bytes, Bytes(64)))); }, {"'general.deep'", "nested deeper"});
}

TEST(GgufCorrupt, DuplicateKeysAndBadAlignment) {
  GgufBuilder dup;
  dup.add_u32("llama.block_count", 1);
  dup.add_u32("llama.block_count", 2);
  expect_error([&] { parse_gguf(dup.build()); }, {"bad.gguf", "duplicate metadata key 'llama.block_count'"});
  GgufBuilder align;
  align.add_u32("general.alignment", 48);
  expect_error([&] { parse_gguf(align.build()); }, {"bad.gguf", "'general.alignment'", "power of two", "48"});
  GgufBuilder align_type;
  align_type.add_string("general.alignment", "32");
  expect_error([&] { parse_gguf(align_type.build()); }, {"'general.alignment'", "power of two"});
}

// Tensor infos written by hand: name, dims, type, offset.
Bytes tensor_info(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
  test::ByteWriter w;
  w.put_string(name);
  w.put<uint32_t>(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) w.put<uint64_t>(d);
  w.put<uint32_t>(type);
  w.put<uint64_t>(offset);
  return w.bytes;
}

// Header + infos padded to 32, then `data_bytes` bytes of data.
Bytes gguf_with_tensors(const std::vector<Bytes>& infos, size_t data_bytes) {
  Bytes rest;
  for (const Bytes& i : infos) rest = test::concat(rest, i);
  Bytes image = gguf_with(infos.size(), 0, rest);
  image.resize((image.size() + 31) / 32 * 32 + data_bytes);
  return image;
}

TEST(GgufCorrupt, TensorErrorsNameTheTensor) {
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("blk.0.attn_q.weight", {8}, 0, 0)}, 16)); },
               {"bad.gguf", "'blk.0.attn_q.weight'", "past its end"});
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("w", {4}, 0, uint64_t{1} << 63)}, 16)); },
               {"bad.gguf", "'w'"});
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("w", {4}, 0, 8)}, 64)); }, {"'w'", "alignment"});
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("w", {4}, 99, 0)}, 64)); }, {"'w'", "unknown ggml type 99"});
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("w", {33}, test::kGgmlQ4_1, 0)}, 64)); },
               {"'w'", "multiple of the 32-value blocks of Q4_1"});
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("w", {1, 1, 1, 1, 1}, 0, 0)}, 64)); }, {"'w'", "5 dimensions"});
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("w", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0)}, 64)); },
               {"'w'", "overflow"});
  expect_error([] {
    parse_gguf(gguf_with_tensors({tensor_info("a", {16}, 0, 0), tensor_info("b", {16}, 0, 32)}, 128));
  }, {"bad.gguf", "'b'", "overlaps tensor 'a'"});
  expect_error([] { parse_gguf(gguf_with_tensors({tensor_info("a", {4}, 0, 0), tensor_info("a", {4}, 0, 32)}, 64)); },
               {"'a'", "duplicate"});
}

TEST(GgufCorrupt, DataSectionPastTheEnd) {
  Bytes image = gguf_with_tensors({tensor_info("w", {4}, 0, 0)}, 0);
  image.resize(image.size() - 4);  // padding cut short
  expect_error([&] { parse_gguf(image); }, {"bad.gguf", "data section"});
}

}  // namespace
}  // namespace tessera
