// tests/fuzz/fuzz_openai_request.cpp: libFuzzer target: any byte string as the body of each OpenAI
// endpoint, through parse_body and the endpoint's parser into the front end's input, then the
// sampling checks and the attention checks against a fixed model (request_checks.h). The first
// byte picks the endpoint. Rejections must be ApiError or tessera::Error (a 4xx naming the field); anything else, such as a JSON type
// error escaping, a crash or a sanitizer report, is a finding: the server would answer it with a 500.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/error.h"
#include "server/frontend/api_error.h"
#include "server/http/openai_request.h"
#include "tests/fuzz/request_checks.h"

namespace {

void check_generate(const tessera::http::ParsedGenerate& parsed) {
  parsed.input.sampling.validate();
  const size_t prompt = parsed.prompts.empty() || !parsed.prompts[0].tokens ? 100 : parsed.prompts[0].tokens->size();
  tessera::fuzz::check_attention(parsed.input.attention, prompt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    tessera::http::find_invalid_utf8(body);
    const nlohmann::json json = tessera::http::parse_body(body);
    switch (data[0] % 5) {
      case 0: check_generate(tessera::http::parse_completion_request(json)); break;
      case 1: check_generate(tessera::http::parse_chat_request(json)); break;
      case 2: tessera::http::parse_embeddings_request(json); break;
      case 3: tessera::http::parse_tokenize_request(json); break;
      default: tessera::http::parse_detokenize_request(json); break;
    }
  } catch (const tessera::ApiError&) {
  } catch (const tessera::Error&) {
  }
  return 0;
}
