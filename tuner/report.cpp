// tuner/report.cpp: report.html and table.md.
#include "tuner/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tessera::tuner {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(double v, int decimals = 2) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, v);
  return text;
}

std::string timing_text(const Timing& t) {
  return fmt(t.median_ms, t.median_ms < 10 ? 2 : 1) + " (" + fmt(t.min_ms, t.min_ms < 10 ? 2 : 1) + "&ndash;" +
         fmt(t.max_ms, t.max_ms < 10 ? 2 : 1) + ")";
}

// Where the int4_g128 candidates' linear weights came from ("calibrated (sidecar sha256 ...): <method>" or
// "round-to-nearest"), "" when none was measured: the same format name means different weights
// with and without a calibration sidecar, and a reader of the numbers must know which.
std::string int4_weights_source(const ReportInput& in) {
  std::vector<std::string> sources;
  for (const Measurement& m : in.measurements) {
    if (!m.weights_source.empty() && std::find(sources.begin(), sources.end(), m.weights_source) == sources.end()) {
      sources.push_back(m.weights_source);
    }
  }
  std::string joined;
  for (const std::string& s : sources) joined += (joined.empty() ? "" : "; ") + s;
  return joined;
}

// "Nice" axis ticks covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int want) {
  const double span = std::max(hi - lo, 1e-12);
  const double raw = span / want;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
  return out;
}

constexpr const char* kNoQuality = "n/a (random weights)";

bool quality_measured(const ReportInput& in) { return in.measurements[in.reference].quality_measured; }

// The scatter of the measured candidates in `subset` (indices into in.measurements): latency against
// quality, or against memory when quality was not measurable (random weights).
std::string plot_svg(const ReportInput& in, const std::vector<size_t>& subset, const std::string& title) {
  const bool quality = quality_measured(in);
  const auto yv = [&](const Measurement& m) { return quality ? m.quality_loss() : m.memory_mb(); };
  constexpr double W = 960, H = 540, left = 80, right = 30, top = 60, bottom = 60;
  std::vector<size_t> ok;
  for (size_t i : subset) {
    if (in.measurements[i].ok()) ok.push_back(i);
  }
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' viewBox='0 0 " << W << " "
      << H << "' font-family='sans-serif' font-size='12'>\n";
  svg << "<rect width='100%' height='100%' fill='white'/>\n";
  svg << "<text x='" << left << "' y='24' font-size='15' font-weight='bold'>" << escape(title) << "</text>\n";
  if (ok.empty()) {
    svg << "<text x='20' y='40'>no candidate was measured</text></svg>\n";
    return svg.str();
  }
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300, mem_max = 0;
  for (size_t i : ok) {
    const Measurement& m = in.measurements[i];
    x0 = std::min(x0, m.latency_ms()), x1 = std::max(x1, m.latency_ms());
    y0 = std::min(y0, yv(m)), y1 = std::max(y1, yv(m));
    mem_max = std::max(mem_max, m.memory_mb());
  }
  const double xpad = std::max((x1 - x0) * 0.08, x1 * 0.02 + 1e-9), ypad = std::max((y1 - y0) * 0.1, std::fabs(y1) * 0.002 + 1e-9);
  x0 -= xpad, x1 += xpad, y0 -= ypad, y1 += ypad;
  if (x0 < 0) x0 = 0;
  const auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  const auto py = [&](double y) { return H - bottom - (y - y0) / (y1 - y0) * (H - top - bottom); };
  // Axes and grid.
  svg << "<g stroke='#ddd'>\n";
  for (double t : ticks(x0, x1, 8)) svg << "<line x1='" << px(t) << "' y1='" << top << "' x2='" << px(t) << "' y2='" << H - bottom << "'/>\n";
  for (double t : ticks(y0, y1, 6)) svg << "<line x1='" << left << "' y1='" << py(t) << "' x2='" << W - right << "' y2='" << py(t) << "'/>\n";
  svg << "</g>\n<g fill='#333'>\n";
  for (double t : ticks(x0, x1, 8)) {
    svg << "<text x='" << px(t) << "' y='" << H - bottom + 18 << "' text-anchor='middle'>" << fmt(t, t < 10 ? 2 : 1) << "</text>\n";
  }
  for (double t : ticks(y0, y1, 6)) {
    svg << "<text x='" << left - 8 << "' y='" << py(t) + 4 << "' text-anchor='end'>" << fmt(t, !quality ? 0 : in.encoder ? 5 : 3)
        << "</text>\n";
  }
  svg << "</g>\n";
  svg << "<rect x='" << left << "' y='" << top << "' width='" << W - left - right << "' height='" << H - top - bottom
      << "' fill='none' stroke='#888'/>\n";
  const std::string xlabel = in.encoder ? "encode latency, first length (ms, median)"
                                        : "decode step latency, first batch size (ms, median)";
  const std::string ylabel = !quality     ? std::string("memory, MiB (quality ") + kNoQuality + ")"
                             : in.encoder ? "1 - cosine to the reference (lower is better)"
                                          : "perplexity on held-out text (lower is better)";
  svg << "<text x='" << (left + W - right) / 2 << "' y='" << H - 18 << "' text-anchor='middle' font-size='14'>" << xlabel
      << "</text>\n";
  svg << "<text transform='translate(22," << (top + H - bottom) / 2 << ") rotate(-90)' text-anchor='middle' font-size='14'>"
      << ylabel << "</text>\n";
  // Points: dominated grey, front blue, the choice ringed in red; radius grows with memory.
  const auto radius = [&](const Measurement& m) { return 4.0 + 14.0 * std::sqrt(m.memory_mb() / std::max(mem_max, 1e-9)); };
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i : ok) {
      const bool on_front = std::find(in.front.begin(), in.front.end(), i) != in.front.end();
      if (on_front != (pass == 1)) continue;
      const Measurement& m = in.measurements[i];
      svg << "<circle cx='" << px(m.latency_ms()) << "' cy='" << py(yv(m)) << "' r='" << radius(m)
          << "' fill='" << (on_front ? "#1f6fd1" : "#aaa") << "' fill-opacity='" << (on_front ? 0.55 : 0.35)
          << "' stroke='" << (on_front ? "#0b3d91" : "#777") << "'><title>" << escape(m.candidate.key()) << ": "
          << fmt(m.latency_ms()) << " ms, quality " << (quality ? fmt(m.quality_loss(), 4) : kNoQuality) << ", "
          << fmt(m.memory_mb(), 1)
          << " MiB</title></circle>\n";
      if (on_front) {
        svg << "<text x='" << px(m.latency_ms()) + radius(m) + 3 << "' y='" << py(yv(m)) - 3
            << "' font-size='11' fill='#0b3d91'>" << escape(m.candidate.short_label()) << "</text>\n";
      }
    }
  }
  const Measurement& c = in.measurements[in.chosen];
  if (c.ok() && std::find(ok.begin(), ok.end(), in.chosen) != ok.end()) {
    svg << "<circle cx='" << px(c.latency_ms()) << "' cy='" << py(yv(c)) << "' r='" << radius(c) + 6
        << "' fill='none' stroke='#d62728' stroke-width='3'/>\n";
    // The label runs from the marker toward the plot's middle, below it unless that leaves the plot,
    // so that a choice at an edge keeps its label inside.
    const double cx = px(c.latency_ms()), cy = py(yv(c)), r = radius(c);
    const bool left_half = cx < (left + W - right) / 2.0;
    const double below = cy + r + 22;
    svg << "<text x='" << (left_half ? cx - r : cx + r) << "' y='" << (below <= H - bottom - 4 ? below : cy - r - 12)
        << "' text-anchor='" << (left_half ? "start" : "end") << "' font-weight='bold' fill='#d62728'>chosen: "
        << escape(c.candidate.short_label()) << "</text>\n";
  }
  // Legend: one row above the plot, where it hides no point.
  const double lx = left + 6, ly = top - 14;
  svg << "<g font-size='12'>\n";
  svg << "<circle cx='" << lx << "' cy='" << ly << "' r='6' fill='#1f6fd1' fill-opacity='0.55' stroke='#0b3d91'/>"
      << "<text x='" << lx + 10 << "' y='" << ly + 4 << "'>Pareto front (latency, quality, memory)</text>\n";
  svg << "<circle cx='" << lx + 270 << "' cy='" << ly << "' r='6' fill='#aaa' fill-opacity='0.35' stroke='#777'/>"
      << "<text x='" << lx + 280 << "' y='" << ly + 4 << "'>dominated</text>\n";
  svg << "<circle cx='" << lx + 370 << "' cy='" << ly << "' r='7' fill='none' stroke='#d62728' stroke-width='3'/>"
      << "<text x='" << lx + 382 << "' y='" << ly + 4 << "'>chosen by the policy; marker area grows with memory</text>"
      << "</g>\n";
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace

std::string report_html(const ReportInput& in) {
  std::ostringstream h;
  const Measurement& ref = in.measurements[in.reference];
  h << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Tessera tune: " << escape(in.model) << "</title>\n"
    << "<style>body{font-family:sans-serif;margin:24px;color:#222} table{border-collapse:collapse;font-size:12px}"
       " td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap} th{background:#f0f0f0}"
       " td.l{text-align:left} tr.front td{background:#eef4fd} tr.chosen td{background:#fde8e8;font-weight:bold}"
       " .meta{font-size:13px;color:#444} code{font-size:12px}</style></head><body>\n";
  h << "<h2>Tessera tune: " << escape(in.model) << "</h2>\n<p class='meta'>model sha256 <code>"
    << escape(in.model_sha256) << "</code><br>device " << escape(in.device) << " &middot; commit <code>"
    << escape(in.commit.substr(0, 12)) << "</code> &middot; space <code>" << escape(in.space) << "</code> &middot; "
    << in.measurements.size() << " candidates, " << in.front.size() << " on the front &middot; wall time "
    << fmt(in.wall_seconds, 1) << " s &middot; load average " << escape(in.load) << "<br>policy <b>" << escape(in.policy) << "</b>: " << escape(in.reason)
    << "<br>chosen: <b>" << escape(in.measurements[in.chosen].candidate.key()) << "</b>";
  if (const std::string source = int4_weights_source(in); !source.empty()) {
    h << "<br>int4_g128 weights: " << escape(source);
  }
  h << "</p>\n";
  std::vector<size_t> all(in.measurements.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  h << plot_svg(in, all, "All candidates") << "<br>\n";
  // Quality differences among the good candidates vanish beside a poor format's: zoom on those
  // within 3% of the best quality loss (perplexity) or 1e-3 of it (1 - cosine).
  double best = 1e300;
  for (const Measurement& m : in.measurements) {
    if (m.ok()) best = std::min(best, m.quality_loss());
  }
  std::vector<size_t> close;
  for (size_t i : all) {
    const Measurement& m = in.measurements[i];
    if (m.ok() && (in.encoder ? m.quality_loss() <= best + 1e-3 : m.quality_loss() <= best * 1.03)) close.push_back(i);
  }
  if (quality_measured(in) && close.size() < all.size() && close.size() > 1) {
    h << plot_svg(in, close, in.encoder ? "Zoom: within 0.001 of the best cosine" : "Zoom: within 3% of the best perplexity")
      << "\n";
  }
  h << "<h3>Every candidate</h3>\n<table>\n<tr><th>#</th><th>weights</th><th>KV cache</th><th>add+RMSNorm</th>"
       "<th>QKV</th><th>gate-up</th><th>RoPE in KV write</th><th>CUDA graphs</th><th>threads</th><th>act. bits</th>"
       "<th>decode split &ge;</th>";
  for (const Timing& t : ref.prefill) h << "<th>prefill " << t.size << " tok, ms</th>";
  for (const Timing& t : ref.decode) h << "<th>decode b" << t.size << ", ms</th>";
  if (in.encoder) {
    h << "<th>cosine</th>";
  } else {
    h << "<th>perplexity</th><th>&Delta;ppl %</th><th>KL (nats)</th>";
  }
  h << "<th>weights MiB</th><th>KV MiB</th><th>front</th></tr>\n";
  for (size_t i = 0; i < in.measurements.size(); ++i) {
    const Measurement& m = in.measurements[i];
    const bool on_front = std::find(in.front.begin(), in.front.end(), i) != in.front.end();
    const Candidate& c = m.candidate;
    h << "<tr class='" << (i == in.chosen ? "chosen" : on_front ? "front" : "") << "' title='" << escape(c.key())
      << "'><td>" << i + 1 << "</td><td class='l'>" << escape(c.weight_format) << (i == in.reference ? " (reference)" : "")
      << "</td><td class='l'>" << escape(c.kv_dtype) << "</td><td class='l'>"
      << (c.fuse_add_rms_norm ? "fused" : "separate") << "</td><td class='l'>"
      << (c.fuse_qkv ? "fused" : "separate") << "</td><td class='l'>" << escape(c.gate_up) << "</td><td class='l'>"
      << (c.rope_in_kv_write ? "fused" : "separate") << "</td><td class='l'>" << (c.cuda_graphs ? "on" : "off")
      << "</td><td>"
      << (c.threads == 0 ? std::string("all") : std::to_string(c.threads)) << "</td><td>"
      << (c.activation_bits == 0 ? std::string("default") : std::to_string(c.activation_bits)) << "</td><td>"
      << (c.decode_split_min_tokens == 0 ? std::string("default") : std::to_string(c.decode_split_min_tokens))
      << "</td>";
    if (!m.ok()) {
      h << "<td class='l' colspan='" << ref.prefill.size() + ref.decode.size() + (in.encoder ? 1 : 3) + 3
        << "'>failed: " << escape(m.error) << "</td></tr>\n";
      continue;
    }
    for (const Timing& t : m.prefill) h << "<td>" << timing_text(t) << "</td>";
    for (const Timing& t : m.decode) h << "<td>" << timing_text(t) << "</td>";
    if (!m.quality_measured) {
      h << "<td class='l' colspan='" << (in.encoder ? 1 : 3) << "'>" << kNoQuality << "</td>";
    } else if (in.encoder) {
      h << "<td>" << fmt(m.cosine, 6) << "</td>";
    } else {
      h << "<td>" << fmt(m.perplexity, 3) << "</td><td>" << fmt(100.0 * (m.perplexity / ref.perplexity - 1.0), 2)
        << "</td><td>" << fmt(m.kl, 4) << "</td>";
    }
    h << "<td>" << fmt(static_cast<double>(m.weight_bytes) / 1048576.0, 1) << "</td><td>"
      << fmt(static_cast<double>(m.kv_bytes) / 1048576.0, 1) << "</td><td>" << (i == in.chosen ? "chosen" : on_front ? "yes" : "")
      << "</td></tr>\n";
  }
  h << "</table>\n<p class='meta'>Latency: after warm-up, median (min&ndash;max): CUDA events on a GPU, wall time "
       "on the CPU. Memory: weights as kept "
       "plus the KV cache at the space's context. Quality is relative to the most precise candidate (the reference).</p>\n"
       "</body></html>\n";
  return h.str();
}

std::string report_markdown(const ReportInput& in) {
  std::ostringstream md;
  const Measurement& ref = in.measurements[in.reference];
  md << "# Tessera tune: " << in.model << "\n\n";
  md << "- model sha256: `" << in.model_sha256 << "`\n- device: " << in.device << "\n- commit: `" << in.commit
     << "`\n- space: `" << in.space << "`\n- policy: " << in.policy << " (" << in.reason << ")\n- chosen: `"
     << in.measurements[in.chosen].candidate.key() << "`\n- wall time: " << fmt(in.wall_seconds, 1)
     << " s\n- load average (1 min) at start / end: " << in.load << "\n";
  if (const std::string source = int4_weights_source(in); !source.empty()) md << "- int4_g128 weights: " << source << "\n";
  md << "\n";
  md << "| # | candidate | threads |";
  for (const Timing& t : ref.prefill) md << " prefill " << t.size << " ms |";
  for (const Timing& t : ref.decode) md << " decode b" << t.size << " ms |";
  md << (in.encoder ? " cosine |" : " ppl | Δppl % | KL |") << " weights MiB | KV MiB | front |\n|";
  const size_t cols = 3 + ref.prefill.size() + ref.decode.size() + (in.encoder ? 1 : 3) + 3;
  for (size_t i = 0; i < cols; ++i) md << " --- |";
  md << "\n";
  for (size_t i = 0; i < in.measurements.size(); ++i) {
    const Measurement& m = in.measurements[i];
    const bool on_front = std::find(in.front.begin(), in.front.end(), i) != in.front.end();
    md << "| " << i + 1 << " | `" << m.candidate.key() << "`" << (i == in.reference ? " (reference)" : "") << " | "
       << m.candidate.threads << " |";
    if (!m.ok()) {
      md << " failed: " << m.error << " |\n";
      continue;
    }
    const auto t = [](const Timing& x) { return fmt(x.median_ms) + " (" + fmt(x.min_ms) + "-" + fmt(x.max_ms) + ")"; };
    for (const Timing& x : m.prefill) md << " " << t(x) << " |";
    for (const Timing& x : m.decode) md << " " << t(x) << " |";
    if (!m.quality_measured) {
      md << " " << kNoQuality << " |" << (in.encoder ? "" : " n/a | n/a |");
    } else if (in.encoder) {
      md << " " << fmt(m.cosine, 6) << " |";
    } else {
      md << " " << fmt(m.perplexity, 3) << " | " << fmt(100.0 * (m.perplexity / ref.perplexity - 1.0), 2) << " | "
         << fmt(m.kl, 4) << " |";
    }
    md << " " << fmt(static_cast<double>(m.weight_bytes) / 1048576.0, 1) << " | "
       << fmt(static_cast<double>(m.kv_bytes) / 1048576.0, 1) << " | "
       << (i == in.chosen ? "**chosen**" : on_front ? "yes" : "") << " |\n";
  }
  return md.str();
}

}  // namespace tessera::tuner
