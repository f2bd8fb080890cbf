// tuner/measure.h: Measurement, what one candidate costs and gives on this machine (prefill and decode
// step latency, quality against the reference candidate, memory), and Measurer, which loads the model
// as a candidate says and times it on the backend the server would use.
//
// Not thread-safe: one Measurer measures one candidate at a time (the timings need the machine).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config/model_config.h"
#include "models/model_files.h"
#include "models/weights/weight_store.h"
#include "tuner/space.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::tuner {

// Wall time of one shape after warm-up: median and spread of the repeats.
struct Timing {
  int size = 0;  // prefill tokens or decode batch
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
};

struct Measurement {
  Candidate candidate;
  std::string error;  // non-empty: the candidate could not run; no numbers
  std::vector<Timing> prefill;  // per measure.prefill_tokens (BERT: one sequence of that many tokens)
  std::vector<Timing> decode;   // per measure.decode_batch (decoders only)
  bool quality_measured = true; // false with random weights: perplexity, kl and cosine mean nothing (null in JSON)
  double perplexity = 0.0;      // decoders: on the held-out windows
  double kl = 0.0;              // decoders: mean KL(reference || candidate) of next-token distributions, nats
  double cosine = 0.0;          // BERT: mean cosine to the reference's embeddings
  int64_t weight_bytes = 0;     // as the backend keeps them
  int64_t kv_bytes = 0;         // KV cache at the space's context
  double seconds = 0.0;         // measuring it took
  std::string settings;         // fingerprint of what was measured how (resume only reuses equal ones)
  // int4_g128 candidates: where the linear weights came from, int4_weights_source() (the model's
  // calibration sidecar, models/calibrated_weights.h) or "round-to-nearest"; empty for other formats.
  std::string weights_source;

  bool ok() const { return error.empty(); }
  // The objectives, all minimised: latency (decode step at the first decode batch; BERT: encode at
  // the first length), quality loss (perplexity; BERT: 1 - cosine; 0 when not measured), memory
  // (weights + KV, MiB).
  double latency_ms() const;
  double quality_loss() const;
  double memory_mb() const;

  nlohmann::json to_json() const;
  static Measurement from_json(const nlohmann::json& json);  // throws naming the missing field
};

// Converts a candidate's weight_format into what the loader does ("gguf": nothing).
bool requantizes(const Candidate& candidate);

class Measurer {
 public:
  // Loads the model's config, tokenizer and evaluation text. Throws when the space asks for something
  // this model or build cannot do (naming the field). With `random_weights_seed` the model folder
  // needs only config.json: the weights are drawn once from the seed (tuner/random_weights.h), the
  // timed tokens are drawn too, and quality is not measured.
  Measurer(const std::string& model, const TuneSpace& space, std::string space_dir,
           std::optional<uint64_t> random_weights_seed = std::nullopt);
  ~Measurer();

  bool is_encoder() const;
  const ModelFiles& files() const { return files_; }
  const ModelConfig& config() const { return config_; }
  std::string settings_fingerprint() const { return settings_; }
  // The most precise candidate of the space: highest-precision weight format, everything fused, the
  // most threads. Its outputs are the quality reference.
  Candidate reference_candidate() const;
  // Measures one candidate. The reference must be measured (or its outputs computed with
  // compute_reference) first: quality is relative to it.
  Measurement measure(const Candidate& candidate);
  // Runs the reference's quality pass only (to resume a run whose reference was measured before).
  void compute_reference();
  bool has_reference() const { return !measures_quality() || !reference_.empty(); }
  // False with random weights.
  bool measures_quality() const { return !random_weights_; }
  // Where int4_g128 candidates' linear weights come from (Measurement::weights_source); empty when the
  // space has no int4_g128 candidate.
  const std::string& int4_weights_source() const { return int4_weights_source_; }

 private:
  struct Loaded;
  std::unique_ptr<Loaded> load(const Candidate& candidate) const;
  void time_decoder(Loaded& loaded, Measurement& m) const;
  void time_encoder(Loaded& loaded, Measurement& m) const;
  // Perplexity and KL (decoders) or cosine (BERT); keep_reference stores the outputs as the reference.
  void score(Loaded& loaded, Measurement& m, bool keep_reference);

  TuneSpace space_;
  ModelFiles files_;
  ModelConfig config_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<int32_t> eval_tokens_;                // decoders: held-out text
  std::vector<std::vector<int32_t>> sentences_;     // BERT: tokenized sentences
  std::vector<float> reference_;  // decoders: log-probs [positions, vocab]; BERT: embeddings [n, hidden]
  std::string settings_;
  std::shared_ptr<const WeightStore> random_weights_;  // --random-weights: drawn once, shared by the candidates
  int format_rank_of_file_ = -1;  // the file's lowest weight precision, for the "gguf" format (read once)
  std::string int4_weights_source_;
};

// The held-out text's default path: <model dir>/eval-text-wiki/wiki.utf8 (scripts/fetch-models puts
// exllamav2's hash-checked wiki.utf8 there).
std::string default_eval_text_path();

}  // namespace tessera::tuner
