// tests/fuzz/fuzz_safetensors.cpp: libFuzzer target: any byte string through parse_safetensors and
// fp32 conversion of every float tensor. The only acceptable failure is tessera::Error.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "models/weights/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto image = std::make_shared<std::vector<std::byte>>(size);
  if (size > 0) std::memcpy(image->data(), data, size);
  try {
    tessera::WeightStore store;
    tessera::parse_safetensors(std::move(image), "fuzz.safetensors", store);
    for (const std::string& name : store.names()) {
      const tessera::WeightView& t = store.get(name);
      if (tessera::dtype_is_float(t.dtype)) store.to_f32(name);
    }
    store.count_by_dtype();
  } catch (const tessera::Error&) {
  }
  return 0;
}
