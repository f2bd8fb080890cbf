// ServerConfig: strict keys, typed errors naming the key path, --set overrides, validation, and the
// shipped configs/server.yaml.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "server/config/server_config.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

const char* kMinimal = R"(
models:
  - path: smollm2-135m-instruct
)";

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_server_config(yaml, "test.yaml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ServerConfig, DefaultsAndMinimal) {
  const ServerConfig c = parse_server_config(kMinimal, "test.yaml");
  EXPECT_EQ(c.http.host, "127.0.0.1");
  EXPECT_EQ(c.http.port, 8080);
  EXPECT_EQ(c.grpc.port, 50051);
  ASSERT_EQ(c.models.size(), 1u);
  EXPECT_EQ(c.models[0].name, "smollm2-135m-instruct");  // defaults to the path
  EXPECT_EQ(c.models[0].kind, ServedModelSpec::Kind::kAuto);
  EXPECT_TRUE(c.auth.api_keys.empty());
  EXPECT_EQ(c.log_level, "info");
  const EngineConfig e = c.engine_config();
  EXPECT_EQ(e.max_queue_size, c.limits.max_queue_size);
  EXPECT_EQ(e.max_batch_tokens, ServerConfig::kCpuStepDefaults.max_batch_tokens);
}

TEST(ServerConfig, TensorParallelIsOneGpuByDefaultAndRefusesWhatItCannotShard) {
  EXPECT_EQ(parse_server_config(kMinimal, "test.yaml").tensor_parallel, 1);
  EXPECT_EQ(parse_server_config(kMinimal, "test.yaml", {"tensor_parallel=2"}).tensor_parallel, 2);
  EXPECT_THAT(error_of(kMinimal, {"tensor_parallel=0"}), HasSubstr("tensor_parallel: must be in [1, 8]"));
  EXPECT_THAT(error_of(kMinimal, {"tensor_parallel=2", "backend=cpu"}), HasSubstr("backend is cpu"));
  EXPECT_THAT(error_of(kMinimal, {"tensor_parallel=2", "speculative.method=draft_model",
                                  "speculative.draft_model=smollm2-135m-instruct"}),
              HasSubstr("speculative.method: draft_model"));
}

TEST(ServerConfig, RandomWeightsAreForDecodersWithoutAProfile) {
  const ServerConfig c = parse_server_config(kMinimal, "test.yaml",
                                             {"models.0.random_weights=true", "models.0.tokenizer=other"});
  EXPECT_TRUE(c.models[0].random_weights);
  EXPECT_EQ(c.models[0].tokenizer, "other");
  EXPECT_THAT(error_of(kMinimal, {"models.0.random_weights=true", "models.0.kind=embedding"}),
              HasSubstr("models.0.random_weights"));
  EXPECT_THAT(error_of(kMinimal, {"models.0.random_weights=true", "profile=p.yaml"}), HasSubstr("tuner profile"));
}

TEST(ServerConfig, SpeculationIsOffByDefaultAndItsKeysReachTheEngine) {
  EXPECT_FALSE(parse_server_config(kMinimal, "test.yaml").engine_config().speculative.enabled());
  const EngineConfig e = parse_server_config(kMinimal, "test.yaml",
                                             {"speculative.method=suffix", "speculative.num_speculative_tokens=6",
                                              "speculative.prompt_lookup_min=3", "speculative.prompt_lookup_max=5",
                                              "speculative.prompt_lookup_unambiguous_min=2",
                                              "speculative.suffix_decoding_max_tree_depth=16",
                                              "speculative.suffix_decoding_max_cached_requests=8",
                                              "speculative.suffix_decoding_min_token_prob=0.25",
                                              "speculative.untimed_row_cost=0.25"})
                             .engine_config();
  EXPECT_EQ(e.speculative.method, "suffix");
  EXPECT_EQ(e.speculative.num_speculative_tokens, 6);
  EXPECT_EQ(e.speculative.ngram.min_n, 3);
  EXPECT_EQ(e.speculative.ngram.max_n, 5);
  EXPECT_EQ(e.speculative.ngram.unambiguous_min_n, 2);
  EXPECT_EQ(e.speculative.suffix.max_match, 16);
  EXPECT_EQ(e.speculative.suffix.max_cached_outputs, 8);
  EXPECT_FLOAT_EQ(e.speculative.suffix.min_share, 0.25f);
  EXPECT_DOUBLE_EQ(e.speculative.untimed_row_cost, 0.25);
  EXPECT_THAT(error_of(kMinimal, {"speculative.method=eagle"}), HasSubstr("speculative.method"));
  EXPECT_THAT(error_of(kMinimal, {"speculative.num_speculative_tokens=0"}),
              HasSubstr("speculative.num_speculative_tokens"));
  EXPECT_THAT(error_of(kMinimal, {"speculative.prompt_lookup_min=3", "speculative.prompt_lookup_max=2"}),
              HasSubstr("speculative.prompt_lookup_max"));
  EXPECT_THAT(error_of(kMinimal, {"speculative.prompt_lookup_unambiguous_min=3"}),
              HasSubstr("speculative.prompt_lookup_unambiguous_min"));
  EXPECT_THAT(error_of(kMinimal, {"speculative.suffix_decoding_min_token_prob=2"}),
              HasSubstr("speculative.suffix_decoding_min_token_prob"));
  EXPECT_THAT(error_of(kMinimal, {"speculative.untimed_row_cost=-1"}), HasSubstr("speculative.untimed_row_cost"));
  const EngineConfig drafted = parse_server_config(kMinimal, "test.yaml",
                                                   {"speculative.method=draft_model", "speculative.draft_model=small",
                                                    "speculative.draft_kv_tokens=4096"})
                                   .engine_config();
  EXPECT_EQ(drafted.speculative.draft_model, "small");
  EXPECT_EQ(drafted.speculative.draft_kv_tokens, 4096);
  EXPECT_THAT(error_of(kMinimal, {"speculative.method=draft_model"}), HasSubstr("speculative.draft_model"));
  EXPECT_THAT(error_of(kMinimal, {"speculative.draft_model=small"}), HasSubstr("speculative.draft_model"));
}

TEST(ServerConfig, StepSizesTakeTheDevicesDefaultsUnlessSet) {
  const ServerConfig unset = parse_server_config(kMinimal, "test.yaml");
  const EngineConfig cpu = unset.engine_config(DeviceKind::kCpu);
  const EngineConfig gpu = unset.engine_config(DeviceKind::kCuda);
  EXPECT_EQ(cpu.max_batch_tokens, 2048);
  EXPECT_EQ(cpu.max_running_sequences, 128);
  EXPECT_EQ(gpu.max_batch_tokens, ServerConfig::kGpuStepDefaults.max_batch_tokens);
  EXPECT_EQ(gpu.max_running_sequences, ServerConfig::kGpuStepDefaults.max_running_sequences);
  EXPECT_EQ(gpu.prefill.chunk_tokens, ServerConfig::kGpuStepDefaults.prefill_chunk_tokens);
  EXPECT_EQ(gpu.prefill.max_per_step, 0);

  const ServerConfig set = parse_server_config(kMinimal, "test.yaml",
                                               {"limits.max_batch_tokens=512", "limits.max_running_sequences=8",
                                                "limits.prefill_chunk_tokens=256", "limits.max_prefills_per_step=2"});
  for (const DeviceKind device : {DeviceKind::kCpu, DeviceKind::kCuda}) {
    const EngineConfig e = set.engine_config(device);
    EXPECT_EQ(e.max_batch_tokens, 512);
    EXPECT_EQ(e.max_running_sequences, 8);
    EXPECT_EQ(e.prefill.chunk_tokens, 256);
    EXPECT_EQ(e.prefill.max_per_step, 2);
  }
  EXPECT_THAT(error_of(kMinimal, {"limits.prefill_chunk_tokens=-1"}), HasSubstr("limits.prefill_chunk_tokens"));
  EXPECT_THAT(error_of(kMinimal, {"limits.max_prefills_per_step=-2"}), HasSubstr("limits.max_prefills_per_step"));
}

TEST(ServerConfig, FullDocument) {
  const ServerConfig c = parse_server_config(R"(
http: {enabled: true, host: 0.0.0.0, port: 0}
grpc: {enabled: false, host: ::1, port: 6000}
models:
  - {name: lm, path: /models/lm.gguf, kind: llm, chat_template: chatml}
  - {name: emb, path: minilm, kind: embedding}
auth: {api_keys: [k1, k2], protect_health: true, protect_metrics: true}
limits: {max_queue_size: 3, max_batch_tokens: 64, max_running_sequences: 2, max_model_len: 512,
         max_body_bytes: 4096, request_timeout_s: 1.5, drain_timeout_s: 0}
backend: cpu
threads: 2
http_threads: 8
log_level: debug
profile: ""
)",
                                             "full.yaml");
  EXPECT_EQ(c.http.host, "0.0.0.0");
  EXPECT_EQ(c.http.port, 0);
  EXPECT_FALSE(c.grpc.enabled);
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].chat_template, "chatml");
  EXPECT_EQ(c.models[1].kind, ServedModelSpec::Kind::kEmbedding);
  EXPECT_EQ(c.auth.api_keys, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_TRUE(c.auth.protect_health);
  EXPECT_DOUBLE_EQ(c.limits.request_timeout_s, 1.5);
  EXPECT_EQ(c.limits.max_model_len, 512);
  EXPECT_EQ(c.engine_config().max_model_len, 512);
  EXPECT_EQ(c.http_threads, 8);
}

TEST(ServerConfig, UnknownKeysNameTheirPath) {
  EXPECT_THAT(error_of(std::string(kMinimal) + "bogus: 1\n"), HasSubstr("unknown config key 'bogus'"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "http: {prot: 1}\n"), HasSubstr("unknown config key 'http.prot'"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "http: {prot: 1}\n"), HasSubstr("port"));  // lists the known keys
  EXPECT_THAT(error_of("models:\n  - {path: a, colour: red}\n"), HasSubstr("unknown config key 'models.0.colour'"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "limits: {max_queue: 1}\n"),
              HasSubstr("unknown config key 'limits.max_queue'"));
}

TEST(ServerConfig, WrongTypesNameKeyAndType) {
  EXPECT_THAT(error_of(std::string(kMinimal) + "http: {port: eighty}\n"),
              HasSubstr("http.port: expected an integer, got 'eighty'"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "http: {port: 80.5}\n"), HasSubstr("http.port: expected an integer"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "auth: {protect_health: maybe}\n"),
              HasSubstr("auth.protect_health: expected a boolean"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "auth: {api_keys: k1}\n"),
              HasSubstr("auth.api_keys: expected a list of strings"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "limits: {request_timeout_s: soon}\n"),
              HasSubstr("limits.request_timeout_s: expected a number"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "http: [1, 2]\n"), HasSubstr("http: expected a mapping"));
  EXPECT_THAT(error_of("models: {path: x}\n"), HasSubstr("models: expected a list"));
  EXPECT_THAT(error_of("models:\n  - {path: a, kind: chat}\n"),
              HasSubstr("models.0.kind: expected one of llm, embedding, auto"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "http: {port: 1\n"), HasSubstr("not valid YAML"));
}

TEST(ServerConfig, ValidationNamesTheField) {
  EXPECT_THAT(error_of("{}"), HasSubstr("models: at least one model"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "http: {port: 70000}\n"), HasSubstr("http.port: must be in [0, 65535]"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "limits: {max_queue_size: 0}\n"), HasSubstr("limits.max_queue_size"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "limits: {request_timeout_s: 0}\n"),
              HasSubstr("limits.request_timeout_s"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "log_level: loud\n"), HasSubstr("log_level: expected one of"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "backend: tpu\n"), HasSubstr("backend: expected auto, cpu or cuda"));
  EXPECT_THAT(error_of("models:\n  - {name: a, path: x}\n  - {name: a, path: y}\n"), HasSubstr("served twice"));
  EXPECT_THAT(error_of("models:\n  - {path: x, chat_template: jinja}\n"), HasSubstr("models.0.chat_template"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "auth: {api_keys: ['']}\n"), HasSubstr("auth.api_keys[0]"));
}

TEST(ServerConfig, Overrides) {
  const ServerConfig c = parse_server_config(kMinimal, "test.yaml",
                                             {"http.port=9001", "auth.api_keys=[a, b]", "limits.drain_timeout_s=2.5",
                                              "models.0.chat_template=chatml", "models.1.path=minilm",
                                              "log_level=warn", "grpc.enabled=false"});
  EXPECT_EQ(c.http.port, 9001);
  EXPECT_EQ(c.auth.api_keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_DOUBLE_EQ(c.limits.drain_timeout_s, 2.5);
  ASSERT_EQ(c.models.size(), 2u);  // index == size appends
  EXPECT_EQ(c.models[0].chat_template, "chatml");
  EXPECT_EQ(c.models[1].path, "minilm");
  EXPECT_EQ(c.log_level, "warn");
  EXPECT_FALSE(c.grpc.enabled);
  // Replacing the model list, as `serve --model M` does.
  const ServerConfig d = parse_server_config(kMinimal, "t", {"models=[]", "models.0.path=other"});
  ASSERT_EQ(d.models.size(), 1u);
  EXPECT_EQ(d.models[0].path, "other");
  // Sections absent from the file are created.
  const ServerConfig e = parse_server_config("{}", "t", {"models.0.path=x", "limits.max_model_len=128"});
  EXPECT_EQ(e.limits.max_model_len, 128);
  const ServerConfig kv = parse_server_config("{}", "t", {"models.0.path=x", "limits.kv_cache_tokens=100"});
  EXPECT_EQ(kv.engine_config().kv_num_blocks, (100 + 15) / 16);  // whole 16-token blocks, rounded up
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).engine_config().kv_num_blocks, 0);
  // Unset is not 0: the server sizes an unset cache per backend (0.9 of the free GPU memory).
  EXPECT_FALSE(parse_server_config("{}", "t", {"models.0.path=x"}).limits.kv_cache_tokens.has_value());
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", "limits.kv_cache_tokens=0"}).limits.kv_cache_tokens,
            std::optional<int64_t>(0));
  EXPECT_THROW(parse_server_config("{}", "t", {"models.0.path=x", "limits.kv_cache_tokens=-1"}), Error);
  EXPECT_THROW(parse_server_config("{}", "t", {"models.0.path=x", "limits.kv_cache_memory_fraction=0.99"}), Error);
  EXPECT_DOUBLE_EQ(parse_server_config("{}", "t", {"models.0.path=x", "limits.kv_cache_memory_fraction=0.8"})
                       .limits.kv_cache_memory_fraction,
                   0.8);
  // The new keys of the GPU engine: validated by name.
  EXPECT_THROW(parse_server_config("{}", "t", {"models.0.path=x", "dtype=fp8"}), Error);
  EXPECT_THROW(parse_server_config("{}", "t", {"models.0.path=x", "device=-1"}), Error);
  EXPECT_FALSE(parse_server_config("{}", "t", {"models.0.path=x", "cuda_graphs=false"}).cuda_graphs);
  // metrics.prefix: tessera (default) or vllm, by name.
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).metrics.prefix, "tessera");
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", "metrics.prefix=vllm"}).metrics.prefix, "vllm");
  EXPECT_THROW(parse_server_config("{}", "t", {"models.0.path=x", "metrics.prefix=sglang"}), Error);
  EXPECT_THROW(parse_server_config("{}", "t", {"models.0.path=x", "metrics.prefixes=vllm"}), Error);
  // Prefix caching is on unless turned off, and reaches the engine.
  EXPECT_TRUE(parse_server_config("{}", "t", {"models.0.path=x"}).engine_config().prefix_caching);
  EXPECT_FALSE(parse_server_config("{}", "t", {"models.0.path=x", "prefix_caching=false"}).engine_config().prefix_caching);
  EXPECT_THROW(parse_server_config("{}", "t", {"models.0.path=x", "prefix_caching=sometimes"}), Error);
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).backend, "auto");
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).dtype, "auto");
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", "dtype=fp16"}).dtype, "fp16");
  // The CPU backend keeps weights as stored unless asked for the fp32 reference.
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).cpu_weights, "native");
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", "cpu_weights=f32"}).cpu_weights, "f32");
  EXPECT_THAT(error_of(kMinimal, {"cpu_weights=f16"}), HasSubstr("cpu_weights: expected native or f32"));
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).cuda_weights, "native");
  for (const char* format : {"int8", "int4_g128", "fp8_e4m3"}) {
    EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", std::string("cuda_weights=") + format}).cuda_weights,
              format);
  }
  EXPECT_THAT(error_of(kMinimal, {"cuda_weights=q4_0"}),
              HasSubstr("cuda_weights: expected native, int8, int4_g128 or fp8_e4m3, got 'q4_0'"));
  EXPECT_THAT(error_of(kMinimal, {"cuda_weights=int8", "dtype=fp16"}),
              HasSubstr("cuda_weights: int8 needs dtype bf16 or auto"));
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).cpu_activation_bits, 16);
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", "cpu_activation_bits=8"}).cpu_activation_bits, 8);
  EXPECT_THAT(error_of(kMinimal, {"cpu_activation_bits=12"}), HasSubstr("cpu_activation_bits: expected 8 or 16"));
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).cuda_decode_split_min_tokens, 0);
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", "cuda_decode_split_min_tokens=64"})
                .cuda_decode_split_min_tokens,
            64);
  EXPECT_THAT(error_of(kMinimal, {"cuda_decode_split_min_tokens=48"}),
              HasSubstr("cuda_decode_split_min_tokens: expected 0 (the kernel's default) or a multiple of 32 in "
                        "[32, 1024], got 48"));
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x"}).cuda_kv_dtype, "native");
  EXPECT_EQ(parse_server_config("{}", "t", {"models.0.path=x", "cuda_kv_dtype=fp8_e4m3"}).cuda_kv_dtype, "fp8_e4m3");
  EXPECT_THAT(error_of(kMinimal, {"cuda_kv_dtype=fp8"}),
              HasSubstr("cuda_kv_dtype: expected native (the dtype) or fp8_e4m3, got 'fp8'"));
  EXPECT_THAT(error_of(kMinimal, {"cuda_kv_dtype=fp8_e4m3", "dtype=fp16"}),
              HasSubstr("cuda_kv_dtype: fp8_e4m3 needs dtype bf16 or auto"));
}

TEST(ServerConfig, EngineHealthKeysAndTestSwitches) {
  const ServerConfig defaults = parse_server_config(kMinimal, "test.yaml");
  EXPECT_DOUBLE_EQ(defaults.limits.engine_stall_timeout_s, 60.0);
  EXPECT_TRUE(defaults.limits.exit_on_fatal_error);
  EXPECT_EQ(defaults.engine_config().faults.step_delay_ms, 0);
  EXPECT_EQ(defaults.engine_config().faults.fail_step, 0);
  const ServerConfig c = parse_server_config(kMinimal, "test.yaml",
                                             {"limits.engine_stall_timeout_s=1.5", "limits.exit_on_fatal_error=false",
                                              "debug.step_delay_ms=3000", "debug.fail_step=3"});
  EXPECT_FALSE(c.limits.exit_on_fatal_error);
  const EngineConfig e = c.engine_config();
  EXPECT_DOUBLE_EQ(e.stall_timeout_s, 1.5);
  EXPECT_EQ(e.faults.step_delay_ms, 3000);
  EXPECT_EQ(e.faults.fail_step, 3);
  EXPECT_THAT(error_of(kMinimal, {"limits.engine_stall_timeout_s=0"}), HasSubstr("limits.engine_stall_timeout_s"));
  EXPECT_THAT(error_of(kMinimal, {"debug.step_delay_ms=-1"}), HasSubstr("debug.step_delay_ms"));
  EXPECT_THAT(error_of(kMinimal, {"debug.fail_step=-2"}), HasSubstr("debug.fail_step"));
  EXPECT_THAT(error_of(kMinimal, {"debug.fail=1"}), HasSubstr("unknown config key 'debug.fail'"));
}

TEST(ServerConfig, BadOverridesAreErrors) {
  EXPECT_THAT(error_of(kMinimal, {"http.prot=1"}), HasSubstr("unknown config key 'http.prot'"));
  EXPECT_THAT(error_of(kMinimal, {"http.port=abc"}), HasSubstr("http.port: expected an integer, got 'abc'"));
  EXPECT_THAT(error_of(kMinimal, {"noequals"}), HasSubstr("expected key=value"));
  EXPECT_THAT(error_of(kMinimal, {"models.5.path=x"}), HasSubstr("past the end"));
  EXPECT_THAT(error_of(kMinimal, {"models.x.path=y"}), HasSubstr("expected a number"));
  EXPECT_THAT(error_of(kMinimal, {"http..port=1"}), HasSubstr("empty key segment"));
  EXPECT_THAT(error_of(std::string(kMinimal) + "log_level: info\n", {"log_level.x=1"}), HasSubstr("not a mapping"));
  EXPECT_THAT(error_of(kMinimal, {"log_level.x=1"}), HasSubstr("log_level: expected a string, got a mapping"));
}

TEST(ServerConfig, ShippedConfigLoads) {
  const ServerConfig c = load_server_config(std::string(TESSERA_SOURCE_DIR) + "/configs/server.yaml");
  EXPECT_EQ(c.http.host, "127.0.0.1");
  EXPECT_EQ(c.http.port, 8080);
  EXPECT_EQ(c.grpc.port, 50051);
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].kind, ServedModelSpec::Kind::kLlm);
  EXPECT_EQ(c.models[1].kind, ServedModelSpec::Kind::kEmbedding);
  EXPECT_TRUE(c.auth.api_keys.empty());
  EXPECT_THROW(load_server_config("/nonexistent/server.yaml"), Error);
}

}  // namespace
}  // namespace tessera
