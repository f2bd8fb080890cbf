// tuner/space.cpp: parse_space and Candidate keys.
#include "tuner/space.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "tuner/yaml_reader.h"

namespace tessera::tuner {

const std::vector<std::string> kCpuWeightFormats{"gguf", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"};
const std::vector<std::string> kGpuWeightFormats{"bf16", "f16", "fp8_e4m3", "int8", "int4_g128"};

namespace {

const char* fused_word(bool fused) { return fused ? "fused" : "separate"; }

bool contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

std::string joined(const std::vector<std::string>& list) {
  std::string s;
  for (const std::string& v : list) s += (s.empty() ? "" : ", ") + v;
  return s;
}

// fused | separate -> true | false.
std::vector<bool> read_fusion(YamlMap& map, const std::string& key, std::vector<bool> fallback) {
  std::vector<std::string> words;
  map.get_list(key, words);
  if (words.empty()) return fallback;
  std::vector<bool> out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] != "fused" && words[i] != "separate") {
      map.fail(key + "[" + std::to_string(i) + "]", "expected fused or separate, got '" + words[i] + "'");
    }
    out.push_back(words[i] == "fused");
  }
  return out;
}

std::vector<bool> read_bools(YamlMap& map, const std::string& key, std::vector<bool> fallback) {
  std::vector<std::string> words;
  map.get_list(key, words);
  if (words.empty()) return fallback;
  std::vector<bool> out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] != "true" && words[i] != "false") {
      map.fail(key + "[" + std::to_string(i) + "]", "expected true or false, got '" + words[i] + "'");
    }
    out.push_back(words[i] == "true");
  }
  return out;
}

void check_positive_list(YamlMap& map, const std::string& key, const std::vector<int>& values, int max) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 1 || values[i] > max) {
      map.fail(key + "[" + std::to_string(i) + "]",
               "expected 1.." + std::to_string(max) + ", got " + std::to_string(values[i]));
    }
  }
}

}  // namespace

std::string Candidate::key() const {
  std::ostringstream os;
  os << weight_format << "/kv=" << kv_dtype << "/arn=" << fused_word(fuse_add_rms_norm) << "/qkv=" << fused_word(fuse_qkv)
     << "/gu=" << gate_up << "/rope=" << fused_word(rope_in_kv_write) << "/graphs=" << (cuda_graphs ? "on" : "off")
     << "/t" << threads;
  if (activation_bits != 0) os << "/a" << activation_bits;
  if (decode_split_min_tokens != 0) os << "/s" << decode_split_min_tokens;
  return os.str();
}

std::string Candidate::short_label() const {
  std::string s = weight_format;
  if (kv_dtype != "f32") s += " kv=" + kv_dtype;
  if (!fuse_add_rms_norm) s += " arn=sep";
  if (!fuse_qkv) s += " qkv=sep";
  if (gate_up != "fused") s += " gu=" + std::string(gate_up == "separate" ? "sep" : gate_up);
  if (rope_in_kv_write) s += " rope=fused";
  if (cuda_graphs) s += " graphs";
  if (threads != 0) s += " t" + std::to_string(threads);
  if (activation_bits != 0) s += " a" + std::to_string(activation_bits);
  if (decode_split_min_tokens != 0) s += " split>=" + std::to_string(decode_split_min_tokens);
  return s;
}

std::string Policy::describe() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::kFastestDecodeWithinPplPct: os << "fastest_decode_within_ppl_pct: "; break;
    case Kind::kBestQualityWithinMemoryMb: os << "best_quality_within_memory_mb: "; break;
    case Kind::kFastestWithinCosine: os << "fastest_within_cosine: "; break;
  }
  os << value;
  return os.str();
}

std::vector<int64_t> TuneSpace::axis_sizes() const {
  return {static_cast<int64_t>(weight_formats.size()), static_cast<int64_t>(kv_dtypes.size()),
          static_cast<int64_t>(add_rms_norm.size()),   static_cast<int64_t>(qkv.size()),
          static_cast<int64_t>(gate_up.size()),        static_cast<int64_t>(rope_kv_write.size()),
          static_cast<int64_t>(cuda_graphs.size()),    static_cast<int64_t>(threads.size()),
          static_cast<int64_t>(activation_bits.size()), static_cast<int64_t>(decode_split_min_tokens.size())};
}

int64_t TuneSpace::size() const {
  int64_t n = 1;
  for (int64_t s : axis_sizes()) n *= s;
  return n;
}

Candidate TuneSpace::at(const std::vector<int64_t>& c) const {
  TESSERA_CHECK(c.size() == 10, "candidate choice has " << c.size() << " axes, expected 10");
  Candidate out;
  out.weight_format = weight_formats.at(static_cast<size_t>(c[0]));
  out.kv_dtype = kv_dtypes.at(static_cast<size_t>(c[1]));
  out.fuse_add_rms_norm = add_rms_norm.at(static_cast<size_t>(c[2]));
  out.fuse_qkv = qkv.at(static_cast<size_t>(c[3]));
  out.gate_up = gate_up.at(static_cast<size_t>(c[4]));
  out.rope_in_kv_write = rope_kv_write.at(static_cast<size_t>(c[5]));
  out.cuda_graphs = cuda_graphs.at(static_cast<size_t>(c[6]));
  out.threads = threads.at(static_cast<size_t>(c[7]));
  out.activation_bits = activation_bits.at(static_cast<size_t>(c[8]));
  out.decode_split_min_tokens = decode_split_min_tokens.at(static_cast<size_t>(c[9]));
  return out;
}

Candidate TuneSpace::at_index(int64_t flat) const {
  const std::vector<int64_t> sizes = axis_sizes();
  std::vector<int64_t> choice(sizes.size());
  for (size_t i = sizes.size(); i-- > 0;) {
    choice[i] = flat % sizes[i];
    flat /= sizes[i];
  }
  return at(choice);
}

std::vector<Candidate> TuneSpace::all() const {
  std::vector<Candidate> out;
  for (int64_t i = 0; i < size(); ++i) out.push_back(at_index(i));
  return out;
}

TuneSpace parse_space(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    TESSERA_FAIL(source << ": not valid YAML: " << e.what());
  }
  TuneSpace space;
  space.source = source;
  YamlMap top(root, source, "");
  top.get("backend", space.backend);
  if (space.backend != "cpu" && space.backend != "cuda") top.fail("backend", "expected cpu or cuda, got '" + space.backend + "'");
  const bool cpu = space.backend == "cpu";
  top.get("context", space.context);
  if (space.context < 1) top.fail("context", "expected a token count >= 1");

  if (!cpu) space.weight_formats = {"bf16"}, space.kv_dtypes = {"bf16"}, space.cuda_graphs = {true};
  top.get_list("weight_format", space.weight_formats);
  const std::vector<std::string>& formats = cpu ? kCpuWeightFormats : kGpuWeightFormats;
  for (size_t i = 0; i < space.weight_formats.size(); ++i) {
    const std::string& f = space.weight_formats[i];
    if (contains(formats, f)) continue;
    const std::string key = "weight_format[" + std::to_string(i) + "]";
    if (cpu && contains(kGpuWeightFormats, f)) {
      top.fail(key, f + " is a GPU weight format (backend: cuda); the cpu backend runs " + joined(kCpuWeightFormats));
    }
    if (!cpu && contains(kCpuWeightFormats, f)) {
      top.fail(key, f + " is a CPU weight format (backend: cpu); the cuda backend runs " + joined(kGpuWeightFormats));
    }
    top.fail(key, "unknown weight format '" + f + "' (expected one of " + joined(formats) + ")");
  }
  top.get_list("kv_dtype", space.kv_dtypes);
  for (size_t i = 0; i < space.kv_dtypes.size(); ++i) {
    const std::string& d = space.kv_dtypes[i];
    const std::vector<std::string> allowed = cpu ? std::vector<std::string>{"f32"}
                                                 : std::vector<std::string>{"bf16", "f16", "fp8_e4m3"};
    if (!contains(allowed, d)) {
      top.fail("kv_dtype[" + std::to_string(i) + "]", "the " + space.backend + " backend keeps its KV cache in " +
                                                        joined(allowed) + ", not '" + d + "'");
    }
    // An fp8 cache's kernels take bf16 activations; weight_format f16 runs f16 ones, so the pair could
    // only fail when measured.
    if (d == "fp8_e4m3" && contains(space.weight_formats, "f16")) {
      top.fail("kv_dtype[" + std::to_string(i) + "]",
               "fp8_e4m3 needs bf16 activations, and weight_format f16 runs f16 ones (list f16 in another space)");
    }
  }
  space.cuda_graphs = read_bools(top, "cuda_graphs", space.cuda_graphs);
  if (cpu && std::find(space.cuda_graphs.begin(), space.cuda_graphs.end(), true) != space.cuda_graphs.end()) {
    top.fail("cuda_graphs", "true needs the cuda backend; the cpu backend runs steps as they come (use [false])");
  }

  {
    YamlMap fusions(top.node("fusions"), source, "fusions");
    space.add_rms_norm = read_fusion(fusions, "add_rms_norm", space.add_rms_norm);
    space.qkv = read_fusion(fusions, "qkv", space.qkv);
    fusions.get_list("gate_up", space.gate_up);
    for (size_t i = 0; i < space.gate_up.size(); ++i) {
      const std::string& g = space.gate_up[i];
      const std::string key = "gate_up[" + std::to_string(i) + "]";
      if (g != "fused" && g != "separate" && g != "epilogue") {
        fusions.fail(key, "expected fused (one GEMM, then silu_mul), separate (two GEMMs) or epilogue (SiLU in the "
                          "GEMM), got '" + g + "'");
      }
      if (g == "epilogue" && cpu) {
        fusions.fail(key, "epilogue (SiLU fused into the gate-up GEMV) is a cuda backend kernel; the cpu backend runs "
                          "fused or separate");
      }
    }
    space.rope_kv_write = read_fusion(fusions, "rope_kv_write", space.rope_kv_write);
    if (cpu && std::find(space.rope_kv_write.begin(), space.rope_kv_write.end(), true) != space.rope_kv_write.end()) {
      fusions.fail("rope_kv_write", "fused (RoPE applied while K is written to the cache) is a cuda backend kernel; "
                                    "the cpu backend runs [separate]");
    }
    fusions.finish();
  }
  {
    YamlMap kernels(top.node("kernels"), source, "kernels");
    kernels.get_list("threads", space.threads);
    for (size_t i = 0; i < space.threads.size(); ++i) {
      if (space.threads[i] < 0 || space.threads[i] > 1024) {
        kernels.fail("threads[" + std::to_string(i) + "]", "expected 0 (all cores) .. 1024, got " +
                                                             std::to_string(space.threads[i]));
      }
    }
    if (!cpu && (space.threads.size() != 1 || space.threads[0] != 0)) kernels.fail("threads", "applies to the cpu backend only");
    kernels.get_list("activation_bits", space.activation_bits);
    for (size_t i = 0; i < space.activation_bits.size(); ++i) {
      const int bits = space.activation_bits[i];
      if (bits == 0 && space.activation_bits.size() == 1) continue;  // the default: the backend's own
      if (!cpu) kernels.fail("activation_bits", "applies to the cpu backend's block-format matmuls only");
      if (bits != 8 && bits != 16) {
        kernels.fail("activation_bits[" + std::to_string(i) + "]",
                     "expected 8 or 16 (bits of the activations the block-format matmuls quantize), got " +
                         std::to_string(bits));
      }
    }
    kernels.get_list("decode_split_min_tokens", space.decode_split_min_tokens);
    for (size_t i = 0; i < space.decode_split_min_tokens.size(); ++i) {
      const int tokens = space.decode_split_min_tokens[i];
      if (tokens == 0 && space.decode_split_min_tokens.size() == 1) continue;  // the kernel's default
      if (cpu) kernels.fail("decode_split_min_tokens", "applies to the cuda backend's decode attention only");
      if (tokens < 32 || tokens > 1024 || tokens % 32 != 0) {
        kernels.fail("decode_split_min_tokens[" + std::to_string(i) + "]",
                     "expected a multiple of 32 in [32, 1024] (tokens in decode attention's shortest split), got " +
                         std::to_string(tokens));
      }
    }
    kernels.finish();
  }
  {
    YamlMap measure(top.node("measure"), source, "measure");
    measure.get_list("prefill_tokens", space.measure.prefill_tokens);
    check_positive_list(measure, "prefill_tokens", space.measure.prefill_tokens, 1 << 17);
    measure.get_list("decode_batch", space.measure.decode_batch);
    check_positive_list(measure, "decode_batch", space.measure.decode_batch, 4096);
    measure.get("decode_context", space.measure.decode_context);
    if (space.measure.decode_context < 1) measure.fail("decode_context", "expected >= 1");
    measure.get("warmup", space.measure.warmup);
    if (space.measure.warmup < 0) measure.fail("warmup", "expected >= 0");
    measure.get("repeats", space.measure.repeats);
    if (space.measure.repeats < 1) measure.fail("repeats", "expected >= 1");
    measure.finish();
  }
  {
    YamlMap quality(top.node("quality"), source, "quality");
    quality.get("tokens", space.quality.tokens);
    quality.get("window", space.quality.window);
    if (space.quality.window < 2) quality.fail("window", "expected >= 2 tokens");
    if (space.quality.tokens < space.quality.window) quality.fail("tokens", "expected at least one window of tokens");
    quality.get("text", space.quality.text);
    quality.get("sentences", space.quality.sentences);
    quality.finish();
  }
  {
    YamlMap policy(top.node("policy"), source, "policy");
    int set = 0;
    const std::pair<const char*, Policy::Kind> kinds[] = {
        {"fastest_decode_within_ppl_pct", Policy::Kind::kFastestDecodeWithinPplPct},
        {"best_quality_within_memory_mb", Policy::Kind::kBestQualityWithinMemoryMb},
        {"fastest_within_cosine", Policy::Kind::kFastestWithinCosine}};
    for (const auto& [key, kind] : kinds) {
      if (!policy.has(key)) continue;
      ++set;
      space.policy.kind = kind;
      policy.get(key, space.policy.value);
      if (space.policy.value < 0) policy.fail(key, "expected a value >= 0");
      if (kind == Policy::Kind::kFastestWithinCosine && space.policy.value > 1) policy.fail(key, "a cosine is at most 1");
    }
    if (set > 1) policy.fail("", "give one policy, not " + std::to_string(set));
    policy.finish();
  }
  {
    YamlMap search(top.node("search"), source, "search");
    search.get("exhaustive_max", space.search.exhaustive_max);
    search.get("population", space.search.population);
    if (space.search.population < 8 || space.search.population % 4 != 0) {
      search.fail("population", "NSGA-II needs a multiple of 4, at least 8");
    }
    search.get("generations", space.search.generations);
    if (space.search.generations < 1) search.fail("generations", "expected >= 1");
    int seed = 1;
    search.get("seed", seed);
    space.search.seed = static_cast<unsigned>(seed);
    search.finish();
  }
  top.finish();
  return space;
}

TuneSpace load_space(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "--space: cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_space(ss.str(), path);
}

}  // namespace tessera::tuner
