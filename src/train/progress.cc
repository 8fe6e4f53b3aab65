// Progress bar and plain-line formatting.
#include "train/progress.h"

#include <cmath>

#include "core/error.h"

namespace tessera::train {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  }
  return buf;
}

Progress::Progress(FILE* out, bool tty, int64_t log_every, double flops_per_token,
                   double peak_gflops)
    : out_(out),
      tty_(tty),
      log_every_(log_every > 0 ? log_every : 1),
      flops_per_token_(flops_per_token),
      peak_gflops_(peak_gflops) {}

std::string Progress::format(const ProgressStats& s) const {
  const double gflops = flops_per_token_ * s.tokens_per_s * 1e-9;
  const double eta = avg_step_s_ * static_cast<double>(s.total - s.step);
  std::string pct;
  if (peak_gflops_ > 0)
    pct = cat(" (", static_cast<int>(100.0 * gflops / peak_gflops_ + 0.5), "%)");
  char head[160];
  std::snprintf(head, sizeof(head),
                "step %lld/%lld | loss %.4f | lr %.3e | %.0f tok/s | %.1f GFLOP/s",
                static_cast<long long>(s.step), static_cast<long long>(s.total), s.loss, s.lr,
                s.tokens_per_s, gflops);
  return cat(head, pct, " | ETA ", format_duration(eta));
}

void Progress::update(const ProgressStats& s, double step_seconds) {
  // EMA over ~10 steps: smooth enough to read, quick to follow a change in speed.
  avg_step_s_ = avg_step_s_ == 0 ? step_seconds : 0.9 * avg_step_s_ + 0.1 * step_seconds;
  if (!out_) return;
  if (tty_) {
    const double frac = s.total > 0 ? static_cast<double>(s.step) / s.total : 1.0;
    const int width = 20, filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(out_, "\r\033[K[%s] %s", bar.c_str(), format(s).c_str());
    bar_open_ = true;
  } else if (s.step % log_every_ == 0 || s.step == s.total) {
    std::fprintf(out_, "%s\n", format(s).c_str());
  }
  std::fflush(out_);
}

void Progress::message(const std::string& line) {
  if (!out_) return;
  if (bar_open_) std::fprintf(out_, "\r\033[K");
  bar_open_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (out_ && bar_open_) std::fprintf(out_, "\n");
  bar_open_ = false;
  if (out_) std::fflush(out_);
}

}  // namespace tessera::train
