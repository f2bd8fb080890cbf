// tests/fuzz/fuzz_gguf.cpp: libFuzzer target: any byte string through GgufFile::parse, the typed
// getters, to_weight_store (names, RoPE unpermute), fp32 conversion and ModelConfig. The only
// acceptable failure is tessera::Error; anything else (a crash, a sanitizer report, another
// exception type) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "models/config/model_config.h"
#include "models/weights/gguf.h"

namespace {

void exercise(const tessera::GgufFile& file) {
  for (const auto& [key, value] : file.metadata()) {
    switch (value.value.index()) {
      case 0: case 1: try { file.get_int(key); } catch (const tessera::Error&) {} break;
      case 2: file.get_float(key); break;
      case 3: file.get_bool(key); break;
      case 4: file.get_string(key); break;
      default:
        try { file.get_string_array(key); } catch (const tessera::Error&) {}
        try { file.get_float_array(key); } catch (const tessera::Error&) {}
        try { file.get_int_array(key); } catch (const tessera::Error&) {}
    }
  }
  try {
    tessera::model_config_from_gguf(file);
  } catch (const tessera::Error&) {
  }
  const tessera::WeightStore store = file.to_weight_store();
  for (const std::string& name : store.names()) {
    const tessera::WeightView& t = store.get(name);
    if (tessera::dtype_is_float(t.dtype)) store.to_f32(name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto image = std::make_shared<std::vector<std::byte>>(size);
  if (size > 0) std::memcpy(image->data(), data, size);
  try {
    exercise(tessera::GgufFile::parse(std::move(image), "fuzz.gguf"));
  } catch (const tessera::Error&) {
  }
  return 0;
}
