// tuner/profile.h: Profile, what `tessera tune` chose for one model on one device (profile.yaml), and
// what the server needs from it: reading it strictly, checking it was made for this model (sha256 of
// its weight files) and device, and turning its choice into load options (weight format, fusions,
// threads).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/graph_options.h"
#include "models/model_files.h"
#include "models/weights/weight_store.h"
#include "tuner/measure.h"
#include "tuner/space.h"

namespace tessera::tuner {

struct Profile {
  std::string path;  // file it was read from
  std::string model_name;
  std::string model_sha256;
  std::string architecture;
  std::string device;   // this_device() where it was tuned
  std::string backend;  // cpu | cuda
  std::string tessera_version;
  std::string tessera_commit;
  std::string created;  // UTC, ISO 8601
  std::string space;    // the space file
  std::string policy;   // "fastest_decode_within_ppl_pct: 1"
  std::string reason;   // why the policy picked it
  Candidate choice;
  nlohmann::json measured;  // the chosen point's numbers (and the reference's), as written

  // Labels of the /metrics profile_info gauge.
  std::vector<std::pair<std::string, std::string>> metric_labels() const;
};

// Writes profile.yaml. `measured` is chosen's numbers and the reference's.
std::string profile_yaml(const Profile& profile);
// Reads a profile; unknown keys and bad values are errors naming the key.
Profile parse_profile(const std::string& yaml_text, const std::string& source);
Profile load_profile(const std::string& path);

// The model identity a profile is bound to is model_sha256 (models/model_files.h).
// The identity of `tessera tune --random-weights` weights: sha256 of the seed and the config.json they
// are drawn for (no server loads them; the profile still names what was measured).
std::string random_weights_sha256(const ModelFiles& files, uint64_t seed);
// Where a backend's numbers hold: "cpu: <model name from /proc/cpuinfo>" (threads are a choice), or
// "cuda: <GPU name>" (device 0, the one the tuner and the server use by default).
std::string this_device(const std::string& backend);
// "0.1.0", and the commit the binary was built from ("unknown" outside a git checkout).
std::string tessera_version();
std::string tessera_commit();

// Refuses (throws naming what differs and how to override) a profile made for another model hash or
// device, or an int4_g128 profile measured with other int4 weights than the model's now
// (`int4_weights_source`, models/calibrated_weights.h: a calibration sidecar added, removed or
// remade since the tune), unless `force`; returns the warnings to log when forced.
std::vector<std::string> check_profile(const Profile& profile, const std::string& model_sha256,
                                       const std::string& device, const std::string& backend,
                                       const std::string& int4_weights_source, bool force);
// What check_profile compares an int4_g128 choice with: where `files`' int4_g128 weights come from
// now. "" for any other choice, which never opens the sidecar (so a stale one cannot stop it).
std::string current_int4_weights_source(const Candidate& choice, const ModelFiles& files);

// What a choice means at load time.
GraphOptions choice_graph_options(const Candidate& choice);
// A cuda choice's weight_format and kv_dtype in `tessera serve`'s spellings (BackendChoice): the
// activation dtype (fp16 for f16, else bf16), cuda_weights (native, or the quantized format: int8 |
// int4_g128 | fp8_e4m3) and cuda_kv_dtype (native, or fp8_e4m3).
struct CudaWeightsChoice {
  std::string dtype;
  std::string cuda_weights;
  std::string cuda_kv_dtype = "native";
};
CudaWeightsChoice cuda_weights_choice(const Candidate& choice);
// `files`' weights in the choice's format: requantized on the host for a CPU format other than "gguf"
// (and for bf16 / f16); for a GPU weight-only format, which the CUDA backend applies at load, as they
// are, with int4_g128's calibration sidecar overlaid where the model has one
// (models/calibrated_weights.h). The tuner measures, and serve and info load, through this.
WeightStore apply_weight_format(const ModelFiles& files, WeightStore weights, const Candidate& choice);
// Refuses choices this build cannot run on `backend` (GPU-only switches on the cpu, and so on),
// naming the profile field.
void check_choice_runs_on(const Candidate& choice, const std::string& backend, const std::string& source);

// YAML -> JSON (scalars that parse as numbers or booleans become those), for `tessera info --json`.
nlohmann::json yaml_to_json(const std::string& yaml_text);

}  // namespace tessera::tuner
