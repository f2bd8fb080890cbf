// tests/fuzz/make_seeds.cpp: writes small valid GGUF and safetensors files into <out>/gguf and
// <out>/safetensors, to seed the fuzzers' corpora. Usage: fuzz_make_seeds <out>
#include <cstdio>
#include <filesystem>

#include "tests/unit/weights/test_files.h"

namespace t = tessera::test;

namespace {

t::Bytes q_block(size_t bytes, uint8_t fill) {
  t::Bytes b(bytes, std::byte{fill});
  b[0] = std::byte{0x00};
  b[1] = std::byte{0x3C};  // fp16 scale 1.0
  return b;
}

t::Bytes repeat(const t::Bytes& one, int times) {
  t::Bytes out;
  for (int i = 0; i < times; ++i) out = t::concat(out, one);
  return out;
}

// A tiny llama GGUF: every dequantizable type, q/k that need unpermuting, every metadata type.
t::Bytes llama_gguf(uint32_t version, uint64_t alignment) {
  t::GgufBuilder b;
  b.version = version;
  b.alignment = alignment;
  if (alignment != 32) b.add_u32("general.alignment", static_cast<uint32_t>(alignment));
  b.add_string("general.architecture", "llama");
  b.add_u32("llama.block_count", 1);
  b.add_u32("llama.context_length", 64);
  b.add_u32("llama.embedding_length", 32);
  b.add_u32("llama.feed_forward_length", 32);
  b.add_u32("llama.attention.head_count", 2);
  b.add_u32("llama.attention.head_count_kv", 1);
  b.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  b.add_f32("llama.rope.freq_base", 10000.0f);
  b.add<uint8_t>("x.u8", t::kGgufU8, 1);
  b.add<int8_t>("x.i8", t::kGgufI8, -1);
  b.add<uint16_t>("x.u16", t::kGgufU16, 2);
  b.add<int16_t>("x.i16", t::kGgufI16, -2);
  b.add<int32_t>("x.i32", t::kGgufI32, -3);
  b.add<uint64_t>("x.u64", t::kGgufU64, 4);
  b.add<int64_t>("x.i64", t::kGgufI64, -4);
  b.add<double>("x.f64", t::kGgufF64, 0.5);
  b.add<uint8_t>("x.bool", t::kGgufBool, 1);
  b.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  t::ByteWriter nested;
  nested.put<uint32_t>(t::kGgufArray);
  nested.put<uint64_t>(1);
  nested.put<uint32_t>(t::kGgufF32);
  nested.put<uint64_t>(1);
  nested.put<float>(1.0f);
  b.add_raw("x.nested", t::kGgufArray, nested.bytes);
  b.add_tensor({"token_embd.weight", {32, 4}, t::kGgmlQ8_0, repeat(q_block(34, 3), 4)});
  b.add_tensor({"blk.0.attn_q.weight", {32, 32}, t::kGgmlQ4_1, repeat(q_block(20, 0x5a), 32)});
  b.add_tensor({"blk.0.attn_k.weight", {32, 16}, t::kGgmlQ4_0, repeat(q_block(18, 0xa5), 16)});
  b.add_tensor({"blk.0.attn_v.weight", {32, 2}, t::kGgmlF16, t::Bytes(128, std::byte{0x3c})});
  b.add_tensor({"blk.0.attn_norm.weight", {32}, t::kGgmlF32, t::Bytes(128, std::byte{0x3f})});
  b.add_tensor({"output_norm.weight", {4}, t::kGgmlBF16, t::Bytes(8, std::byte{0x3f})});
  return b.build();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out-dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out(argv[1]);
  std::filesystem::create_directories(out / "gguf");
  std::filesystem::create_directories(out / "safetensors");
  t::write_file(out / "gguf" / "llama_v3.gguf", llama_gguf(3, 32));
  t::write_file(out / "gguf" / "llama_v2_align64.gguf", llama_gguf(2, 64));
  t::write_file(out / "safetensors" / "all_dtypes.safetensors",
                t::build_safetensors({
                    {"a", "F32", {2, 2}, t::Bytes(16, std::byte{0x3f})},
                    {"b", "F16", {2}, t::Bytes(4, std::byte{0x3c})},
                    {"c", "BF16", {1, 2}, t::Bytes(4, std::byte{0x3f})},
                    {"d", "F64", {1}, t::Bytes(8, std::byte{0x3f})},
                    {"e", "I64", {1}, t::Bytes(8)},
                    {"f", "I32", {1}, t::Bytes(4)},
                    {"g", "I16", {1}, t::Bytes(2)},
                    {"h", "I8", {1}, t::Bytes(1)},
                    {"i", "U8", {1}, t::Bytes(1)},
                    {"j", "BOOL", {1}, t::Bytes(1)},
                }));
  t::write_file(out / "safetensors" / "one.safetensors", t::build_safetensors({{"w", "F32", {1}, t::Bytes(4)}}));
  std::printf("wrote seeds to %s\n", out.string().c_str());
  return 0;
}
