// tests/unit/weights/weights_test.cpp: safetensors and GGUF readers on files built here, plus the
// real SmolLM2 GGUF and all-MiniLM-L6-v2 safetensors when they are installed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "models/model_files.h"
#include "models/weights/gguf.h"
#include "models/weights/safetensors.h"
#include "models/weights/weight_store.h"
#include "tests/unit/weights/test_files.h"

namespace tessera {
namespace {

using test::Bytes;
using test::GgufBuilder;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint16_t f32_to_bf16_bits(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

// ---------------------------------------------------------------------------------------------
// dtype conversion

TEST(Convert, F16BitPatterns) {
  // 1, -2, 65504 (max), 2^-24 (smallest subnormal), 2^-14 (smallest normal), -0, inf, 0.333 (0x3555)
  const std::vector<uint16_t> bits = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x8000, 0x7C00, 0x3555};
  std::vector<float> out(bits.size());
  convert_to_f32(DType::kF16, test::to_bytes(bits).data(), static_cast<int64_t>(bits.size()), out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_TRUE(std::signbit(out[5]));
  EXPECT_TRUE(std::isinf(out[6]));
  EXPECT_FLOAT_EQ(out[7], 0.333251953125f);
}

TEST(Convert, BF16IsTheHighHalfOfF32) {
  const std::vector<float> values = {1.0f, -3.0f, 0.15625f, 1e30f};
  std::vector<uint16_t> bits;
  for (float v : values) bits.push_back(f32_to_bf16_bits(v));
  std::vector<float> out(values.size());
  convert_to_f32(DType::kBF16, test::to_bytes(bits).data(), 4, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 0.15625f);
  EXPECT_EQ(out[3], std::bit_cast<float>(std::bit_cast<uint32_t>(1e30f) & 0xffff0000u));
}

TEST(Convert, RowBytes) {
  EXPECT_EQ(dtype_row_bytes(DType::kF32, 7), 28u);
  EXPECT_EQ(dtype_row_bytes(DType::kBF16, 7), 14u);
  EXPECT_EQ(dtype_row_bytes(DType::kQ8_0, 64), 68u);
  EXPECT_EQ(dtype_row_bytes(DType::kQ4_0, 64), 36u);
  EXPECT_EQ(dtype_row_bytes(DType::kQ4_1, 576), 360u);
  EXPECT_EQ(dtype_row_bytes(DType::kBool, 3), 3u);
  EXPECT_THROW(dtype_row_bytes(DType::kQ4_1, 33), Error);
  EXPECT_THROW(dtype_row_bytes(DType::kF32, -1), Error);
  EXPECT_THROW(dtype_row_bytes(DType::kF64, int64_t{1} << 62), Error);
}

// Quantized blocks, with expected values written out from ggml's block layouts.
Bytes q8_0_block(uint16_t d_bits, int first) {
  test::ByteWriter w;
  w.put<uint16_t>(d_bits);
  for (int i = 0; i < 32; ++i) w.put<int8_t>(static_cast<int8_t>(first + i * 7 % 255 - 120));
  return w.bytes;
}

TEST(Convert, Q8_0) {
  const Bytes block = q8_0_block(0x3800 /* 0.5 */, 3);
  std::vector<float> out(32);
  convert_to_f32(DType::kQ8_0, block.data(), 32, out.data());
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[i], 0.5f * static_cast<float>(static_cast<int8_t>(3 + i * 7 % 255 - 120))) << i;
  }
}

TEST(Convert, Q4_0LowNibblesFirst) {
  test::ByteWriter w;
  w.put<uint16_t>(0x4000);  // d = 2
  for (int i = 0; i < 16; ++i) w.put<uint8_t>(static_cast<uint8_t>((15 - i) << 4 | i));  // low i, high 15-i
  std::vector<float> out(32);
  convert_to_f32(DType::kQ4_0, w.bytes.data(), 32, out.data());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(out[i], 2.0f * static_cast<float>(i - 8)) << i;
    EXPECT_EQ(out[16 + i], 2.0f * static_cast<float>(15 - i - 8)) << i;
  }
}

TEST(Convert, Q4_1ScaleAndMin) {
  test::ByteWriter w;
  w.put<uint16_t>(0x3400);  // d = 0.25
  w.put<uint16_t>(0xBC00);  // m = -1
  for (int i = 0; i < 16; ++i) w.put<uint8_t>(static_cast<uint8_t>(((i * 3) % 16) << 4 | (i % 16)));
  std::vector<float> out(32);
  convert_to_f32(DType::kQ4_1, w.bytes.data(), 32, out.data());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(out[i], 0.25f * static_cast<float>(i) - 1.0f) << i;
    EXPECT_EQ(out[16 + i], 0.25f * static_cast<float>((i * 3) % 16) - 1.0f) << i;
  }
}

// ---------------------------------------------------------------------------------------------
// safetensors

TEST(Safetensors, ReadsEveryDtype) {
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x3800};
  const std::vector<uint16_t> bf16 = {f32_to_bf16_bits(2.0f), f32_to_bf16_bits(-0.5f)};
  const std::vector<double> f64 = {0.125, -1e10};
  const std::vector<int64_t> i64 = {1, -2, 3};
  const std::vector<int32_t> i32 = {7};
  const std::vector<int16_t> i16 = {-7, 8};
  const std::vector<int8_t> i8 = {-1};
  const std::vector<uint8_t> u8 = {255, 0};
  const std::vector<uint8_t> flags = {1, 0, 1};
  Bytes image = test::build_safetensors({
      {"a.f32", "F32", {2, 3}, test::to_bytes(f32)},
      {"b.f16", "F16", {3}, test::to_bytes(f16)},
      {"c.bf16", "BF16", {1, 2}, test::to_bytes(bf16)},
      {"d.f64", "F64", {2}, test::to_bytes(f64)},
      {"e.i64", "I64", {1, 3}, test::to_bytes(i64)},
      {"f.i32", "I32", {1}, test::to_bytes(i32)},
      {"g.i16", "I16", {2}, test::to_bytes(i16)},
      {"h.i8", "I8", {1}, test::to_bytes(i8)},
      {"i.u8", "U8", {2}, test::to_bytes(u8)},
      {"j.bool", "BOOL", {3}, test::to_bytes(flags)},
      {"k.empty", "F32", {0, 4}, {}},
      {"l.scalar", "F32", {}, test::to_bytes(std::vector<float>{42.0f})},
  });
  WeightStore store;
  parse_safetensors(test::share(std::move(image)), "mem.safetensors", store);
  EXPECT_EQ(store.size(), 12u);
  EXPECT_THAT(store.get("a.f32").shape, ElementsAre(2, 3));
  EXPECT_EQ(store.to_f32("a.f32"), f32);
  EXPECT_EQ(store.to_f32("b.f16"), (std::vector<float>{1.0f, -2.0f, 0.5f}));
  EXPECT_EQ(store.to_f32("c.bf16"), (std::vector<float>{2.0f, -0.5f}));
  EXPECT_EQ(store.to_f32("d.f64"), (std::vector<float>{0.125f, -1e10f}));
  EXPECT_EQ(store.get("e.i64").dtype, DType::kI64);
  EXPECT_EQ(store.get("e.i64").bytes.size(), 24u);
  EXPECT_EQ(store.get("j.bool").dtype, DType::kBool);
  EXPECT_EQ(store.get("k.empty").numel(), 0);
  EXPECT_EQ(store.to_f32("l.scalar"), std::vector<float>{42.0f});
  EXPECT_EQ(store.get("a.f32").source_file, "mem.safetensors");
  const auto counts = store.count_by_dtype();
  EXPECT_EQ(counts.at("F32"), 3u);
  EXPECT_EQ(counts.at("BOOL"), 1u);
  try {
    store.to_f32("e.i64");
    FAIL() << "integer tensor converted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("e.i64"));
    EXPECT_THAT(e.what(), HasSubstr("I64"));
  }
  try {
    store.get("missing.weight");
    FAIL() << "missing tensor found";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing.weight"));
    EXPECT_THAT(e.what(), HasSubstr("mem.safetensors"));
  }
}

TEST(Safetensors, LoadsFileDirectoryAndShardedIndex) {
  test::TempDir dir("st");
  const std::vector<float> a = {1, 2, 3, 4};
  const std::vector<float> b = {5, 6};
  const std::vector<uint16_t> c = {f32_to_bf16_bits(9.0f)};
  test::write_file(dir.path() / "model-00001-of-00002.safetensors",
                   test::build_safetensors({{"layer.a", "F32", {2, 2}, test::to_bytes(a)}, {"layer.b", "F32", {2}, test::to_bytes(b)}}));
  test::write_file(dir.path() / "model-00002-of-00002.safetensors",
                   test::build_safetensors({{"layer.c", "BF16", {1}, test::to_bytes(c)}}));
  test::write_text(dir.path() / "model.safetensors.index.json",
                   R"({"metadata": {"total_size": 26}, "weight_map": {"layer.a": "model-00001-of-00002.safetensors",
                       "layer.b": "model-00001-of-00002.safetensors", "layer.c": "model-00002-of-00002.safetensors"}})");
  for (const auto& path : {dir.path().string(), (dir.path() / "model.safetensors.index.json").string()}) {
    const WeightStore store = load_safetensors(path);
    EXPECT_THAT(store.names(), ElementsAre("layer.a", "layer.b", "layer.c"));
    EXPECT_EQ(store.to_f32("layer.a"), a);
    EXPECT_EQ(store.to_f32("layer.c"), std::vector<float>{9.0f});
    EXPECT_THAT(store.get("layer.c").source_file, HasSubstr("model-00002-of-00002.safetensors"));
  }
  // A single file, by path.
  const WeightStore single = load_safetensors((dir.path() / "model-00002-of-00002.safetensors").string());
  EXPECT_EQ(single.size(), 1u);
}

TEST(Safetensors, IndexErrorsNameTheShardAndTensor) {
  test::TempDir dir("st-index");
  test::write_file(dir.path() / "one.safetensors",
                   test::build_safetensors({{"x", "F32", {1}, test::to_bytes(std::vector<float>{1})}}));
  test::write_text(dir.path() / "model.safetensors.index.json", R"({"weight_map": {"x": "one.safetensors", "y": "one.safetensors"}})");
  try {
    load_safetensors(dir.path().string());
    FAIL() << "index naming an absent tensor loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'y'"));
    EXPECT_THAT(e.what(), HasSubstr("one.safetensors"));
  }
  test::write_text(dir.path() / "model.safetensors.index.json", R"({"weight_map": {"x": "two.safetensors"}})");
  try {
    load_safetensors(dir.path().string());
    FAIL() << "index naming an absent shard loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("two.safetensors"));
  }
  test::write_text(dir.path() / "model.safetensors.index.json", R"({"weight_map": {"x": "../one.safetensors"}})");
  EXPECT_THROW(load_safetensors(dir.path().string()), Error);
}

TEST(Safetensors, DuplicateTensorAcrossShardsIsAnError) {
  test::TempDir dir("st-dup");
  const Bytes one = test::build_safetensors({{"x", "F32", {1}, test::to_bytes(std::vector<float>{1})}});
  test::write_file(dir.path() / "a.safetensors", one);
  test::write_file(dir.path() / "b.safetensors", one);
  test::write_text(dir.path() / "model.safetensors.index.json", R"({"weight_map": {"x": "a.safetensors", "z": "b.safetensors"}})");
  try {
    load_safetensors(dir.path().string());
    FAIL() << "duplicate loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("duplicate tensor 'x'"));
  }
}

// ---------------------------------------------------------------------------------------------
// GGUF

TEST(Gguf, EveryMetadataTypeRoundTrips) {
  GgufBuilder b;
  b.add<uint8_t>("t.u8", test::kGgufU8, 250);
  b.add<int8_t>("t.i8", test::kGgufI8, -100);
  b.add<uint16_t>("t.u16", test::kGgufU16, 65000);
  b.add<int16_t>("t.i16", test::kGgufI16, -32000);
  b.add<uint32_t>("t.u32", test::kGgufU32, 4000000000u);
  b.add<int32_t>("t.i32", test::kGgufI32, -2000000000);
  b.add<uint64_t>("t.u64", test::kGgufU64, uint64_t{1} << 63);
  b.add<int64_t>("t.i64", test::kGgufI64, int64_t{-1} << 62);
  b.add<float>("t.f32", test::kGgufF32, 0.25f);
  b.add<double>("t.f64", test::kGgufF64, -1e300);
  b.add<uint8_t>("t.bool", test::kGgufBool, 1);
  b.add_string("t.string", "h\xc3\xa9llo\n");
  b.add_string("t.empty", "");
  b.add_string_array("t.strings", {"a", "", "ccc"});
  {  // int32 array
    test::ByteWriter w;
    w.put<uint32_t>(test::kGgufI32);
    w.put<uint64_t>(3);
    for (int32_t v : {-1, 0, 7}) w.put<int32_t>(v);
    b.add_raw("t.ints", test::kGgufArray, w.bytes);
  }
  {  // float32 array
    test::ByteWriter w;
    w.put<uint32_t>(test::kGgufF32);
    w.put<uint64_t>(2);
    w.put<float>(1.5f);
    w.put<float>(-2.0f);
    b.add_raw("t.floats", test::kGgufArray, w.bytes);
  }
  {  // nested: array of 2 arrays of uint8
    test::ByteWriter w;
    w.put<uint32_t>(test::kGgufArray);
    w.put<uint64_t>(2);
    w.put<uint32_t>(test::kGgufU8);
    w.put<uint64_t>(2);
    w.put<uint8_t>(1);
    w.put<uint8_t>(2);
    w.put<uint32_t>(test::kGgufU8);
    w.put<uint64_t>(0);
    b.add_raw("t.nested", test::kGgufArray, w.bytes);
  }
  {  // empty array of bools
    test::ByteWriter w;
    w.put<uint32_t>(test::kGgufBool);
    w.put<uint64_t>(0);
    b.add_raw("t.no_bools", test::kGgufArray, w.bytes);
  }
  for (uint32_t version : {2u, 3u}) {
    b.version = version;
    const GgufFile f = GgufFile::parse(test::share(b.build()), "meta.gguf");
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.metadata().size(), 18u);
    EXPECT_EQ(f.get_int("t.u8"), 250);
    EXPECT_EQ(f.get_int("t.i8"), -100);
    EXPECT_EQ(f.get_int("t.u16"), 65000);
    EXPECT_EQ(f.get_int("t.i16"), -32000);
    EXPECT_EQ(f.get_int("t.u32"), 4000000000);
    EXPECT_EQ(f.get_int("t.i32"), -2000000000);
    EXPECT_EQ(std::get<uint64_t>(f.metadata().at("t.u64").value), uint64_t{1} << 63);
    EXPECT_THROW(f.get_int("t.u64"), Error);  // does not fit int64
    EXPECT_EQ(f.get_int("t.i64"), int64_t{-1} << 62);
    EXPECT_EQ(f.get_float("t.f32"), 0.25);
    EXPECT_EQ(f.get_float("t.f64"), -1e300);
    EXPECT_EQ(f.get_float("t.u32"), 4e9);  // integers read as floats
    EXPECT_TRUE(f.get_bool("t.bool"));
    EXPECT_EQ(f.get_string("t.string"), "h\xc3\xa9llo\n");
    EXPECT_EQ(f.get_string("t.empty"), "");
    EXPECT_THAT(f.get_string_array("t.strings"), ElementsAre("a", "", "ccc"));
    EXPECT_THAT(f.get_int_array("t.ints"), ElementsAre(-1, 0, 7));
    EXPECT_THAT(f.get_float_array("t.floats"), ElementsAre(1.5, -2.0));
    const auto& nested = std::get<GgufArray>(f.metadata().at("t.nested").value);
    ASSERT_EQ(nested.size(), 2u);
    EXPECT_EQ(std::get<GgufArray>(nested[0].value).size(), 2u);
    EXPECT_EQ(std::get<uint64_t>(std::get<GgufArray>(nested[0].value)[1].value), 2u);
    EXPECT_TRUE(std::get<GgufArray>(nested[1].value).empty());
    EXPECT_TRUE(std::get<GgufArray>(f.metadata().at("t.no_bools").value).empty());
    EXPECT_FALSE(f.find_int("absent").has_value());
    EXPECT_EQ(f.find_string("t.string").value(), "h\xc3\xa9llo\n");
    EXPECT_TRUE(f.tensors().empty());
  }
}

TEST(Gguf, TypedGettersNameTheKey) {
  GgufBuilder b;
  b.add_string("general.name", "x");
  b.add_string_array("tokens", {"a"});
  const GgufFile f = GgufFile::parse(test::share(b.build()), "getters.gguf");
  auto expect_error = [](auto&& fn, const std::string& key, const std::string& what) {
    try {
      fn();
      FAIL() << "no error for " << key;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("getters.gguf"));
      EXPECT_THAT(e.what(), HasSubstr("'" + key + "'"));
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  expect_error([&] { f.get_int("general.name"); }, "general.name", "expected an integer");
  expect_error([&] { f.get_float("general.name"); }, "general.name", "expected a number");
  expect_error([&] { f.get_bool("general.name"); }, "general.name", "expected a bool");
  expect_error([&] { f.get_string("llama.block_count"); }, "llama.block_count", "missing");
  expect_error([&] { f.get_int_array("tokens"); }, "tokens", "expected an integer");
  expect_error([&] { f.get_string_array("general.name"); }, "general.name", "expected an array");
  expect_error([&] { f.find_int("general.name"); }, "general.name", "expected an integer");
}

// One tensor of each dequantizable type, with alignment 64 and expected values from the raw bytes.
TEST(Gguf, TensorsOfEveryTypeWithCustomAlignment) {
  GgufBuilder b;
  b.alignment = 64;
  b.add_u32("general.alignment", 64);
  b.add_string("general.architecture", "test");  // not llama: names stay as they are
  const std::vector<float> f32 = {1, 2, 3, 4, 5, 6};
  b.add_tensor({"w.f32", {3, 2}, test::kGgmlF32, test::to_bytes(f32)});
  b.add_tensor({"w.f16", {2}, test::kGgmlF16, test::to_bytes(std::vector<uint16_t>{0x3C00, 0x4000})});
  b.add_tensor({"w.bf16", {1}, test::kGgmlBF16, test::to_bytes(std::vector<uint16_t>{f32_to_bf16_bits(-4.0f)})});
  b.add_tensor({"w.f64", {1}, test::kGgmlF64, test::to_bytes(std::vector<double>{0.5})});
  b.add_tensor({"w.i32", {2}, test::kGgmlI32, test::to_bytes(std::vector<int32_t>{5, 6})});
  Bytes q8 = q8_0_block(0x3C00, 0);
  Bytes q8b = q8_0_block(0x3800, 9);
  q8.insert(q8.end(), q8b.begin(), q8b.end());
  b.add_tensor({"w.q8_0", {32, 2}, test::kGgmlQ8_0, q8});
  test::ByteWriter q4_0;
  q4_0.put<uint16_t>(0x3C00);
  for (int i = 0; i < 16; ++i) q4_0.put<uint8_t>(static_cast<uint8_t>(0xF0 | i));
  b.add_tensor({"w.q4_0", {32}, test::kGgmlQ4_0, q4_0.bytes});
  test::ByteWriter q4_1;
  q4_1.put<uint16_t>(0x3800);  // d = 0.5
  q4_1.put<uint16_t>(0x4000);  // m = 2
  for (int i = 0; i < 16; ++i) q4_1.put<uint8_t>(static_cast<uint8_t>(i << 4 | 1));
  b.add_tensor({"w.q4_1", {32}, test::kGgmlQ4_1, q4_1.bytes});

  const GgufFile f = GgufFile::parse(test::share(b.build()), "types.gguf");
  ASSERT_EQ(f.tensors().size(), 8u);
  for (const GgufTensorInfo& t : f.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  const WeightStore store = f.to_weight_store();
  EXPECT_THAT(store.get("w.f32").shape, ElementsAre(2, 3));  // GGUF dims reversed
  EXPECT_EQ(store.to_f32("w.f32"), f32);
  EXPECT_EQ(store.to_f32("w.f16"), (std::vector<float>{1, 2}));
  EXPECT_EQ(store.to_f32("w.bf16"), std::vector<float>{-4});
  EXPECT_EQ(store.to_f32("w.f64"), std::vector<float>{0.5});
  EXPECT_EQ(store.get("w.i32").dtype, DType::kI32);

  const WeightView& q8t = store.get("w.q8_0");
  EXPECT_EQ(q8t.dtype, DType::kQ8_0);
  EXPECT_THAT(q8t.shape, ElementsAre(2, 32));
  EXPECT_EQ(q8t.bytes.size(), 68u);
  EXPECT_EQ(0, std::memcmp(q8t.bytes.data(), q8.data(), q8.size()));  // raw blocks kept
  const std::vector<float> q8v = store.to_f32("w.q8_0");
  EXPECT_EQ(q8v[1], 1.0f * static_cast<float>(static_cast<int8_t>(0 + 7 - 120)));
  EXPECT_EQ(q8v[32 + 2], 0.5f * static_cast<float>(static_cast<int8_t>(9 + 14 - 120)));

  const std::vector<float> q40 = store.to_f32("w.q4_0");
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(q40[i], static_cast<float>(i - 8));
    EXPECT_EQ(q40[16 + i], 7.0f);  // high nibble 15 - 8
  }
  const std::vector<float> q41 = store.to_f32("w.q4_1");
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(q41[i], 0.5f * 1 + 2.0f);
    EXPECT_EQ(q41[16 + i], 0.5f * static_cast<float>(i) + 2.0f);
  }
  EXPECT_EQ(store.count_by_dtype().at("Q4_1"), 1u);
}

// HF rows -> llama.cpp's convert permutation, written the way the converter states it:
// w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2).reshape(rows, cols).
template <typename Row>
std::vector<Row> convert_permute(const std::vector<Row>& hf_rows, int64_t n_head) {
  const auto rows = static_cast<int64_t>(hf_rows.size());
  const int64_t half = rows / n_head / 2;
  std::vector<Row> out;
  for (int64_t h = 0; h < n_head; ++h) {      // axis 0
    for (int64_t i = 0; i < half; ++i) {      // axis 1 after the swap (was axis 2)
      for (int64_t j = 0; j < 2; ++j) {       // axis 2 after the swap (was axis 1)
        out.push_back(hf_rows[static_cast<size_t>((h * 2 + j) * half + i)]);
      }
    }
  }
  return out;
}

TEST(Gguf, UndoesRopePermutationOfQAndKF32) {
  const int64_t n_head = 3, n_head_kv = 1, head_dim = 8, cols = 4;
  auto make_rows = [&](int64_t rows, float tag) {
    std::vector<std::vector<float>> hf(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) hf[static_cast<size_t>(r)].push_back(tag + static_cast<float>(r * 100 + c));
    }
    return hf;
  };
  const auto q_hf = make_rows(n_head * head_dim, 0.0f);
  const auto k_hf = make_rows(n_head_kv * head_dim, 0.5f);
  auto flatten = [](const std::vector<std::vector<float>>& rows) {
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    return flat;
  };
  GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_u32("llama.attention.head_count", n_head);
  b.add_u32("llama.attention.head_count_kv", n_head_kv);
  b.add_tensor({"blk.0.attn_q.weight", {cols, n_head * head_dim}, test::kGgmlF32,
                test::to_bytes(flatten(convert_permute(q_hf, n_head)))});
  b.add_tensor({"blk.0.attn_k.weight", {cols, n_head_kv * head_dim}, test::kGgmlF32,
                test::to_bytes(flatten(convert_permute(k_hf, n_head_kv)))});
  b.add_tensor({"blk.0.attn_v.weight", {cols, n_head_kv * head_dim}, test::kGgmlF32,
                test::to_bytes(flatten(convert_permute(k_hf, n_head_kv)))});  // v is never permuted
  const WeightStore store = GgufFile::parse(test::share(b.build()), "perm.gguf").to_weight_store();
  EXPECT_EQ(store.to_f32("model.layers.0.self_attn.q_proj.weight"), flatten(q_hf));
  EXPECT_EQ(store.to_f32("model.layers.0.self_attn.k_proj.weight"), flatten(k_hf));
  EXPECT_EQ(store.to_f32("model.layers.0.self_attn.v_proj.weight"), flatten(convert_permute(k_hf, n_head_kv)));
  EXPECT_THAT(store.get("model.layers.0.self_attn.q_proj.weight").shape, ElementsAre(24, 4));
}

TEST(Gguf, UndoesRopePermutationOnQuantizedRows) {
  // attn_k with 2 KV heads of head dim 4: 8 rows of one Q8_0 block each, each row tagged by d.
  const int64_t n_head_kv = 2;
  std::vector<Bytes> hf_rows;
  for (int r = 0; r < 8; ++r) hf_rows.push_back(q8_0_block(static_cast<uint16_t>(0x3C00 + r), r));
  Bytes permuted;
  for (const Bytes& row : convert_permute(hf_rows, n_head_kv)) permuted.insert(permuted.end(), row.begin(), row.end());
  GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_u32("llama.attention.head_count", 4);
  b.add_u32("llama.attention.head_count_kv", n_head_kv);
  b.add_tensor({"blk.7.attn_k.weight", {32, 8}, test::kGgmlQ8_0, permuted});
  const WeightStore store = GgufFile::parse(test::share(b.build()), "qperm.gguf").to_weight_store();
  const WeightView& k = store.get("model.layers.7.self_attn.k_proj.weight");
  EXPECT_EQ(k.dtype, DType::kQ8_0);
  for (size_t r = 0; r < 8; ++r) {
    EXPECT_EQ(0, std::memcmp(k.bytes.data() + r * 34, hf_rows[r].data(), 34)) << "row " << r;
  }
}

TEST(Gguf, PermutationNeedsHeadCounts) {
  GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_tensor({"blk.0.attn_q.weight", {4, 6}, test::kGgmlF32, Bytes(96)});
  try {
    GgufFile::parse(test::share(b.build()), "nohead.gguf").to_weight_store();
    FAIL() << "loaded without head counts";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("blk.0.attn_q.weight"));
    EXPECT_THAT(e.what(), HasSubstr("llama.attention.head_count"));
  }
  // An empty q (rows but no columns) has nothing to move, whatever the head count.
  GgufBuilder empty;
  empty.add_string("general.architecture", "llama");
  empty.add<uint64_t>("llama.attention.head_count", test::kGgufU64, uint64_t{1} << 40);
  empty.add_tensor({"blk.0.attn_q.weight", {0, 6}, test::kGgmlF32, {}});
  EXPECT_EQ(GgufFile::parse(test::share(empty.build()), "empty.gguf").to_weight_store().size(), 1u);
  GgufBuilder odd;
  odd.add_string("general.architecture", "llama");
  odd.add_u32("llama.attention.head_count", 4);
  odd.add_tensor({"blk.0.attn_q.weight", {4, 6}, test::kGgmlF32, Bytes(96)});  // 6 rows / 4 heads
  EXPECT_THROW(GgufFile::parse(test::share(odd.build()), "odd.gguf").to_weight_store(), Error);
}

TEST(Gguf, UnsupportedTypeIsNamedWhenBuildingTheStore) {
  GgufBuilder b;
  b.add_tensor({"blk.0.ffn_up.weight", {256}, test::kGgmlQ4_K, Bytes(144)});
  const GgufFile f = GgufFile::parse(test::share(b.build()), "k.gguf");  // sizes still checked
  EXPECT_EQ(f.tensors()[0].ggml_type, test::kGgmlQ4_K);
  EXPECT_STREQ(ggml_type_name(test::kGgmlQ4_K), "Q4_K");
  try {
    f.to_weight_store();
    FAIL() << "Q4_K accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("blk.0.ffn_up.weight"));
    EXPECT_THAT(e.what(), HasSubstr("Q4_K"));
    EXPECT_THAT(e.what(), HasSubstr("k.gguf"));
  }
}

TEST(Gguf, OpensFromDiskAndKeepsTheMapAlive) {
  test::TempDir dir("gguf-disk");
  GgufBuilder b;
  b.add_tensor({"t", {4}, test::kGgmlF32, test::to_bytes(std::vector<float>{1, 2, 3, 4})});
  test::write_file(dir.path() / "m.gguf", b.build());
  WeightStore store;
  {
    const GgufFile f = GgufFile::open((dir.path() / "m.gguf").string());
    store = f.to_weight_store();
  }
  EXPECT_EQ(store.to_f32("t"), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(store.get("t").source_file, (dir.path() / "m.gguf").string());
  try {
    GgufFile::open((dir.path() / "absent.gguf").string());
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("absent.gguf"));
  }
}

// ---------------------------------------------------------------------------------------------
// Real models (skipped when not installed)

std::filesystem::path installed_model(const std::string& folder) {
  const std::filesystem::path p = std::filesystem::path(default_model_dir()) / folder;
  return std::filesystem::exists(p) ? p : std::filesystem::path();
}

TEST(RealModels, SmolLM2Gguf) {
  const auto dir = installed_model("smollm2-135m-instruct");
  if (dir.empty()) GTEST_SKIP() << "smollm2-135m-instruct not installed in " << default_model_dir();
  const ModelFiles files = locate_model("smollm2-135m-instruct");
  ASSERT_EQ(files.format, ModelFormat::kGguf);
  EXPECT_EQ(files.gguf->version(), 3u);
  EXPECT_EQ(files.gguf->tensors().size(), 272u);
  const WeightStore store = load_weights(files);
  EXPECT_EQ(store.size(), 272u);
  const auto counts = store.count_by_dtype();
  EXPECT_EQ(counts.at("Q4_1"), 210u);
  EXPECT_EQ(counts.at("F32"), 61u);
  EXPECT_EQ(counts.at("Q8_0"), 1u);
  EXPECT_THAT(store.get("model.embed_tokens.weight").shape, ElementsAre(49152, 576));
  EXPECT_THAT(store.get("model.layers.0.self_attn.q_proj.weight").shape, ElementsAre(576, 576));
  EXPECT_THAT(store.get("model.layers.29.self_attn.k_proj.weight").shape, ElementsAre(192, 576));
  EXPECT_THAT(store.get("model.layers.0.mlp.down_proj.weight").shape, ElementsAre(576, 1536));
  EXPECT_THAT(store.get("model.layers.0.mlp.gate_proj.weight").shape, ElementsAre(1536, 576));
  EXPECT_THAT(store.get("model.norm.weight").shape, ElementsAre(576));
  EXPECT_FALSE(store.contains("lm_head.weight"));  // tied
  for (const std::string& name : store.names()) {
    EXPECT_TRUE(name.rfind("model.", 0) == 0) << "unmapped GGUF name " << name;
  }
}

// Rows dequantized and unpermuted by the pip gguf package + numpy (make_gguf_reference.py).
TEST(RealModels, SmolLM2MatchesPythonReference) {
  const auto dir = installed_model("smollm2-135m-instruct");
  if (dir.empty()) GTEST_SKIP() << "smollm2-135m-instruct not installed in " << default_model_dir();
  std::ifstream in(TESSERA_WEIGHTS_TEST_DATA "/smollm2_reference.json");
  ASSERT_TRUE(in) << "missing " TESSERA_WEIGHTS_TEST_DATA "/smollm2_reference.json";
  const nlohmann::json reference = nlohmann::json::parse(in);
  const WeightStore store = load_weights(locate_model("smollm2-135m-instruct"));
  size_t compared = 0;
  for (const auto& t : reference["tensors"]) {
    const std::string name = t["name"];
    const std::vector<int64_t> shape = t["shape"];
    ASSERT_EQ(store.get(name).shape, shape) << name;
    EXPECT_STREQ(dtype_name(store.get(name).dtype), t["dtype"].get<std::string>().c_str()) << name;
    const std::vector<float> values = store.to_f32(name);
    const int64_t cols = shape.back();
    if (t.contains("values")) {
      const std::vector<float> expected = t["values"];
      EXPECT_EQ(values, expected) << name;
      compared += expected.size();
      continue;
    }
    for (const auto& [row, expected_json] : t["rows"].items()) {
      const std::vector<float> expected = expected_json;
      const int64_t r = std::stoll(row);
      const std::vector<float> got(values.begin() + r * cols, values.begin() + (r + 1) * cols);
      EXPECT_EQ(got, expected) << name << " row " << r;  // exact: same fp16 * int arithmetic in fp32
      compared += expected.size();
    }
  }
  EXPECT_GT(compared, 20000u);
}

TEST(RealModels, MiniLmSafetensors) {
  const auto dir = installed_model("all-minilm-l6-v2");
  if (dir.empty()) GTEST_SKIP() << "all-minilm-l6-v2 not installed in " << default_model_dir();
  const ModelFiles files = locate_model("all-minilm-l6-v2");
  ASSERT_EQ(files.format, ModelFormat::kHfSafetensors);
  const WeightStore store = load_weights(files);
  EXPECT_EQ(store.size(), 104u);
  EXPECT_EQ(store.count_by_dtype().at("F32"), 103u);
  EXPECT_EQ(store.count_by_dtype().at("I64"), 1u);
  EXPECT_THAT(store.get("embeddings.word_embeddings.weight").shape, ElementsAre(30522, 384));
  EXPECT_THAT(store.get("encoder.layer.5.output.dense.weight").shape, ElementsAre(384, 1536));
  const std::vector<float> gamma = store.to_f32("embeddings.LayerNorm.weight");
  ASSERT_EQ(gamma.size(), 384u);
  for (float g : gamma) EXPECT_TRUE(std::isfinite(g));
}

}  // namespace
}  // namespace tessera
