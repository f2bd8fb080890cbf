// tuner/tune.cpp: run_tune.
#include "tuner/tune.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/error.h"
#include "tuner/measure.h"
#include "tuner/pareto.h"
#include "tuner/profile.h"
#include "tuner/progress.h"
#include "tuner/report.h"
#include "tuner/space.h"

namespace tessera::tuner {

namespace {

// The 1-minute load average ("?" where /proc/loadavg cannot be read).
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  return (in >> first) ? first : std::string("?");
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    TESSERA_CHECK(out.good(), "--out: cannot write " << tmp.string());
    out << text;
  }
  std::filesystem::rename(tmp, path);  // readers never see half a file
}

nlohmann::json timings_yaml(const std::vector<Timing>& timings, const char* prefix) {
  nlohmann::json out = nlohmann::json::object();
  for (const Timing& t : timings) {
    out[std::string(prefix) + std::to_string(t.size)] = {{"median", t.median_ms}, {"min", t.min_ms}, {"max", t.max_ms}};
  }
  return out;
}

nlohmann::json measured_numbers(const Measurement& m, const Measurement& ref, bool encoder, int context) {
  nlohmann::json out;
  out["prefill_ms"] = timings_yaml(m.prefill, "tokens_");
  if (!encoder) out["decode_ms"] = timings_yaml(m.decode, "batch_");
  if (!m.quality_measured) {
    out["quality"] = "n/a (random weights)";
  } else if (encoder) {
    out["cosine_to_reference"] = m.cosine;
  } else {
    out["perplexity"] = m.perplexity;
    out["reference_perplexity"] = ref.perplexity;
    out["perplexity_delta_pct"] = 100.0 * (m.perplexity / ref.perplexity - 1.0);
    out["kl_to_reference"] = m.kl;
  }
  out["reference"] = ref.candidate.key();
  if (!m.weights_source.empty()) out["weights_source"] = m.weights_source;  // int4_g128
  out["weights_mb"] = static_cast<double>(m.weight_bytes) / 1048576.0;
  out["kv_mb"] = static_cast<double>(m.kv_bytes) / 1048576.0;
  out["kv_context_tokens"] = context;
  return out;
}

}  // namespace

TuneSummary run_tune(const TuneOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string load_at_start = load_average();
  const TuneSpace space = load_space(options.space_path);
  const std::string space_dir = std::filesystem::path(options.space_path).parent_path().string();
  Measurer measurer(options.model, space, space_dir.empty() ? "." : space_dir, options.random_weights_seed);
  const bool encoder = measurer.is_encoder();
  if (encoder) {
    TESSERA_CHECK(space.policy.kind != Policy::Kind::kFastestDecodeWithinPplPct,
                  space.source << ": policy: fastest_decode_within_ppl_pct needs a decoder; "
                               << measurer.files().name << " is an encoder (use fastest_within_cosine)");
  }
  const std::string sha = options.random_weights_seed
                              ? random_weights_sha256(measurer.files(), *options.random_weights_seed)
                              : model_sha256(measurer.files());
  const std::string device = this_device(space.backend);
  const std::string settings = measurer.settings_fingerprint() + " model " + sha;
  std::fprintf(stderr, "tune: %s (%s, sha256 %.16s...) on %s: %lld candidates in %s\n", measurer.files().name.c_str(),
               architecture_name(measurer.config().arch), sha.c_str(), device.c_str(),
               static_cast<long long>(space.size()), space.source.c_str());
  if (!measurer.int4_weights_source().empty()) {
    std::fprintf(stderr, "tune: int4_g128 linear weights: %s\n", measurer.int4_weights_source().c_str());
  }

  const std::filesystem::path out_dir(options.out_dir);
  std::filesystem::create_directories(out_dir);
  const std::filesystem::path records = out_dir / "candidates.jsonl";
  // Earlier runs' measurements with the same settings, model and reference are reused.
  std::map<std::string, Measurement> known;
  {
    std::ifstream in(records);
    std::string line;
    int64_t stale = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        continue;  // a line cut by an interrupted run
      }
      Measurement m = Measurement::from_json(j);
      if (m.settings != settings) {
        ++stale;
        continue;
      }
      known[m.candidate.key()] = std::move(m);
    }
    if (!known.empty() || stale > 0) {
      std::fprintf(stderr, "tune: resuming: %zu candidates measured before%s\n", known.size(),
                   stale > 0 ? (", " + std::to_string(stale) + " older records with other settings ignored").c_str() : "");
    }
  }
  std::ofstream append(records, std::ios::app);
  TESSERA_CHECK(append.good(), "--out: cannot write " << records.string());

  const bool exhaustive = space.size() <= space.search.exhaustive_max;
  ProgressBar progress(exhaustive ? space.size() : nsga2_budget(space), options.progress);
  int64_t measured_now = 0;
  std::vector<std::string> visited;  // keys of the candidates this search looked at, in order
  const Candidate reference = measurer.reference_candidate();
  const auto evaluate = [&](const Candidate& c) -> Measurement {
    const std::string key = c.key();
    if (std::find(visited.begin(), visited.end(), key) == visited.end()) {
      visited.push_back(key);
      if (known.count(key) != 0) progress.resumed();
    }
    auto it = known.find(key);
    if (it != known.end()) return it->second;
    if (!(c == reference) && !measurer.has_reference()) {
      // The reference was measured by an earlier run: only its outputs are needed again.
      progress.begin("reference outputs " + reference.short_label());
      measurer.compute_reference();
    }
    progress.begin(c.short_label());
    Measurement m = measurer.measure(c);
    m.settings = settings;  // what a later run compares with
    progress.measured();
    ++measured_now;
    if (!m.ok()) std::fprintf(stderr, "\ntune: %s failed: %s\n", key.c_str(), m.error.c_str());
    append << m.to_json().dump() << "\n";
    append.flush();
    return known[key] = std::move(m);
  };
  evaluate(reference);  // first: quality is relative to it
  if (exhaustive) {
    for (const Candidate& c : space.all()) evaluate(c);
  } else {
    std::fprintf(stderr, "tune: %lld candidates > search.exhaustive_max %d: NSGA-II, population %d, %d generations\n",
                 static_cast<long long>(space.size()), space.search.exhaustive_max, space.search.population,
                 space.search.generations);
    nsga2_search(space, evaluate);
  }
  progress.finish();

  std::vector<Measurement> results;
  size_t reference_index = 0;
  for (const std::string& key : visited) {
    if (key == reference.key()) reference_index = results.size();
    results.push_back(known.at(key));
  }
  const std::vector<size_t> front = pareto_front(results);
  const PolicyChoice choice = choose(results, space.policy, results[reference_index]);
  const Measurement& chosen = results[choice.index];
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Profile profile;
  profile.model_name = measurer.files().name;
  profile.model_sha256 = sha;
  profile.architecture = architecture_name(measurer.config().arch);
  profile.device = device;
  profile.backend = space.backend;
  profile.tessera_version = tessera_version();
  profile.tessera_commit = tessera_commit();
  profile.created = utc_now();
  profile.space = space.source;
  profile.policy = space.policy.describe();
  profile.reason = choice.reason;
  profile.choice = chosen.candidate;
  profile.measured = measured_numbers(chosen, results[reference_index], encoder, space.context);
  const std::filesystem::path profile_path = out_dir / "profile.yaml";
  write_text(profile_path, profile_yaml(profile));

  ReportInput report{profile.model_name, sha,          device, profile.tessera_commit, space.source, profile.policy,
                     choice.reason,      encoder,      results, front,                 choice.index, reference_index,
                     wall,               load_at_start + " / " + load_average()};
  write_text(out_dir / "report.html", report_html(report));
  write_text(out_dir / "table.md", report_markdown(report));
  std::printf("%s\n", report_markdown(report).c_str());
  std::printf("chosen: %s\n  %s\nprofile: %s\nreport: %s\nwall time: %.1f s (%lld measured now, %lld resumed)\n",
              chosen.candidate.key().c_str(), choice.reason.c_str(), profile_path.string().c_str(),
              (out_dir / "report.html").string().c_str(), wall, static_cast<long long>(measured_now),
              static_cast<long long>(static_cast<int64_t>(results.size()) - measured_now));
  std::fflush(stdout);
  return TuneSummary{static_cast<int64_t>(results.size()), measured_now, chosen.candidate.key(), profile_path.string(),
                     wall};
}

}  // namespace tessera::tuner
