// tuner/progress.cpp: ProgressBar.
#include "tuner/progress.h"

#include <algorithm>
#include <cstdio>

#include <unistd.h>

namespace tessera::tuner {

ProgressBar::ProgressBar(int64_t total, bool enabled)
    : total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

void ProgressBar::set_total(int64_t total) { total_ = total; }

std::string ProgressBar::duration_text(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (s < 60) {
    std::snprintf(text, sizeof text, "%llds", s);
  } else if (s < 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  }
  return text;
}

void ProgressBar::draw(const std::string& label) {
  if (!enabled_) return;
  constexpr int kWidth = 24;
  const int64_t total = std::max<int64_t>(total_, 1);
  const int filled = static_cast<int>(kWidth * std::min(done_, total) / total);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::string eta = "ETA ?";
  if (measured_ > 0) {
    const double per = measured_seconds_ / static_cast<double>(measured_);
    eta = "ETA " + duration_text(per * static_cast<double>(std::max<int64_t>(total_ - done_, 0)));
  }
  std::fprintf(stderr, "%stune [%s] %lld/%lld  %s  %s%s", tty_ ? "\r\033[K" : "", bar.c_str(),
               static_cast<long long>(done_), static_cast<long long>(total_), eta.c_str(), label.c_str(),
               tty_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::begin(const std::string& label) {
  label_ = label;
  started_ = Clock::now();
  draw("measuring " + label);
}

void ProgressBar::measured() {
  ++done_;
  ++measured_;
  measured_seconds_ += std::chrono::duration<double>(Clock::now() - started_).count();
  if (tty_) draw("measured " + label_);
}

void ProgressBar::resumed() { ++done_; }

void ProgressBar::finish() {
  if (!enabled_) return;
  if (tty_) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace tessera::tuner
