// Training progress: a one-line bar redrawn with \r on a TTY, plain lines every N steps
// otherwise, showing loss, lr, throughput, achieved GFLOP/s with % of the machine's peak, ETA.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera::train {

struct ProgressStats {
  int64_t step = 0, total = 0;
  double loss = 0, lr = 0, tokens_per_s = 0, grad_norm = 0, elapsed_s = 0;
};

class Progress {
 public:
  // flops_per_token: model FLOPs of one training token; peak_gflops <= 0 hides the % column.
  Progress(FILE* out, bool tty, int64_t log_every, double flops_per_token, double peak_gflops);
  // Shows a step. Throughput and ETA use an exponential moving average of the step time.
  void update(const ProgressStats& s, double step_seconds);
  // Prints a full line (eval result, checkpoint) without garbling the bar.
  void message(const std::string& line);
  void finish();  // ends the bar's line on a TTY

  // The formatted bar text (no \r or newline); exposed for tests.
  std::string format(const ProgressStats& s) const;

 private:
  FILE* out_;
  bool tty_, bar_open_ = false;
  int64_t log_every_;
  double flops_per_token_, peak_gflops_;
  double avg_step_s_ = 0;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace tessera::train
