// `tessera profile [flags] -- COMMAND ...`: runs any command with an observer on every context
// it makes, then reports where its time went, op by op and scope by scope, against this machine's
// roofs (explain/op_profile.h).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/profiling.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "explain/op_profile.h"
#include "explain/report_html.h"
#include "ops/op_tally.h"
#include "profile/probe.h"

namespace tessera::cli {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The tally, plus when the first op began and the last one ended: the span the ops cover,
// outside which the command loads and tears down.
// A device's ops (CUDA) are waited for around each one (ops::TallySwitch::synchronize), so that
// their times are the device's, not their launches'.
class ProfileObserver final : public ops::OpObserver {
 public:
  ProfileObserver() {
    timed_.into = &tally_;
    timed_.synchronize = true;
  }
  void on_begin(std::string_view op, const ops::Context& ctx) override {
    timed_.on_begin(op, ctx);
    const double t = now_seconds();
    const std::lock_guard<std::mutex> lock(mu_);
    if (first_ == 0) first_ = t;
  }
  void on_op(const ops::OpRecord& r) override {
    timed_.on_op(r);
    const double t = now_seconds();
    const std::lock_guard<std::mutex> lock(mu_);
    last_ = std::max(last_, t);
  }
  void enter_scope(std::string_view name, const ops::Context& ctx) override {
    timed_.enter_scope(name, ctx);
  }
  void exit_scope(std::string_view name, const ops::Context& ctx) override {
    timed_.exit_scope(name, ctx);
  }
  const ops::OpTally& tally() const { return tally_; }
  double first() const { return first_; }
  double last() const { return last_; }

 private:
  ops::OpTally tally_;
  ops::TallySwitch timed_;  // into tally_
  std::mutex mu_;
  double first_ = 0, last_ = 0;
};

// After `seconds`, sends this process SIGTERM, which `serve` takes as its signal to drain and
// exit; cancelled when the command ends first. Its own thread blocks the signal, so the
// command's signal thread receives it.
class StopAfter {
 public:
  explicit StopAfter(double seconds) {
    if (seconds <= 0) return;
    thread_ = std::thread([this, seconds] {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGTERM);
      sigaddset(&set, SIGINT);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; }))
        kill(getpid(), SIGTERM);
    });
  }
  ~StopAfter() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

std::string utc(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

int run(const Args& a) {
  std::vector<std::string> cmd = a.wrapped();
  TS_CHECK(!cmd.empty(),
           "nothing to profile: give the command after --, e.g. 'tessera profile -- "
           "generate -p Hi'");
  const std::string name = cmd[0];
  const Command* wrapped = nullptr;
  for (const Command& c : commands())
    if (c.name == name) wrapped = &c;
  TS_CHECK(wrapped, "unknown command '", name, "' after -- (try 'tessera help')");
  TS_CHECK(name != "profile", "profile cannot wrap itself");
  TS_CHECK(name != "bench",
           "the bench commands profile themselves: 'tessera bench generate --profile', "
           "'tessera bench train --profile'");
  const int64_t steps = a.i64("--steps");
  const double seconds = a.f64("--seconds");
  TS_CHECK(steps == 0 || name == "train", "--steps applies to train, not ", name);
  TS_CHECK(seconds == 0 || name == "serve", "--seconds applies to serve, not ", name,
           " (which ends by itself)");
  const std::string out_path = a.str("--out");
  const bool json = a.on("--json");
  const int64_t top = a.i64("--top");
  // --steps N replaces the training run's own --steps (one occurrence, either spelling).
  if (steps > 0) {
    auto it = std::find_if(cmd.begin(), cmd.end(), [](const std::string& w) {
      return w == "--steps" || w.rfind("--steps=", 0) == 0;
    });
    if (it == cmd.end()) {
      cmd.push_back("--steps");
      cmd.push_back(std::to_string(steps));
    } else if (*it == "--steps") {
      TS_CHECK(it + 1 != cmd.end(), "flag --steps of train needs a value");
      *(it + 1) = std::to_string(steps);
    } else {
      *it = "--steps=" + std::to_string(steps);
    }
  }

  ProfileObserver observer;
  const std::vector<std::string> rest(cmd.begin() + 1, cmd.end());
  const double t0 = now_seconds();
  int rc = 0;
  {
    const LendObserver lend(&observer);
    const StopAfter stop(seconds);
    try {
      rc = dispatch(*wrapped, rest, "tessera " + name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessera %s: error: %s\n", name.c_str(), e.what());
      rc = 1;
    }
  }
  const double t1 = now_seconds();
  if (rc != 0) return rc;  // the command said what went wrong; its exit code passes through

  // The roofs: this machine's probe (measured now if stale; the run is over, so it disturbs
  // nothing).
  const int threads = static_cast<int>(default_pool().size());
  const profile::MachinePeaks peaks = profile::cached_peaks(threads);
  const explain::Roofs roofs = explain::cpu_roofs(peaks, threads);
  const ops::OpTotal sum = observer.tally().sum();
  const bool any = observer.first() > 0;
  const double first = any ? observer.first() : t1, last = any ? observer.last() : t1;
  const double window = std::max(0.0, last - first);
  const std::vector<explain::OpProfileRow> rows =
      explain::op_profile(observer.tally().totals(), 1, window, roofs);
  const double other = rows.back().ms / 1e3;
  // Time outside ops that a scope still names: scopes that ran no op (the scheduler's sampling).
  double named = 0;
  std::string named_parts;
  for (const ops::ScopeTotal& s : observer.tally().scopes())
    if (s.op_seconds == 0 && s.seconds > 0) {
      named += s.seconds;
      named_parts += " + " + s.name + " " + std::to_string(s.seconds).substr(0, 5) + " s";
    }
  const int64_t age = std::max<int64_t>(0, std::time(nullptr) - peaks.probed_at);

  std::string report;
  if (json) {
    nlohmann::json j = {{"command", cmd},
                        {"exit_code", rc},
                        {"wall_s", t1 - t0},
                        {"before_first_op_s", first - t0},
                        {"ops_window_s", window},
                        {"ops_s", sum.seconds},
                        {"other_s", other},
                        {"named_outside_ops_s", named},
                        {"after_last_op_s", t1 - last},
                        {"flops", sum.flops},
                        {"bytes", sum.bytes},
                        {"probe", nlohmann::json::parse(profile::peaks_to_json(peaks))},
                        {"probe_age_s", age},
                        {"ops", nlohmann::json::parse(explain::op_profile_json(rows))},
                        {"scopes", nlohmann::json::array()}};
    for (const ops::ScopeTotal& s : observer.tally().scopes())
      j["scopes"].push_back({{"scope", s.name},
                             {"calls", s.calls},
                             {"seconds", s.seconds},
                             {"op_seconds", s.op_seconds},
                             {"flops", s.flops},
                             {"bytes", s.bytes}});
    report = j.dump(1) + "\n";
  } else {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "profile of 'tessera %s': %.3f s\n"
                  "  before the first op %.3f s (loading), ops %.3f s and %.3f s between them "
                  "(other) over %.3f s, after the last op %.3f s\n",
                  joined(cmd).c_str(), t1 - t0, first - t0, sum.seconds, other, window, t1 - last);
    report += buf;
    if (window > 0) {
      std::snprintf(buf, sizeof buf,
                    "  named: %.1f%% of the ops' span (ops %.3f s%s), unnamed %.3f s\n",
                    100 * std::min(1.0, (sum.seconds + named) / window), sum.seconds,
                    named_parts.c_str(), std::max(0.0, window - sum.seconds - named));
      report += buf;
    }
    std::snprintf(buf, sizeof buf,
                  "roofs: probe of %s (%lld min ago, load %.2f on %d cores), %d threads: memory "
                  "%.1f GB/s read, L2 %.0f GB/s, L3 %.1f GB/s; f32 %.0f GFLOP/s, bf16 %.0f, int8 "
                  "%.0f GOP/s (%s)\n",
                  utc(peaks.probed_at).c_str(), static_cast<long long>(age / 60),
                  peaks.load_at_probe, peaks.cores, threads, roofs.memory_gbs, peaks.l2_gbs_all,
                  peaks.l3_gbs_all, peaks.f32_gflops_all, peaks.bf16_gflops_all,
                  peaks.int8_gops_all, peaks.int8_kind.c_str());
    report += buf;
    if (!any) report += "no op ran: nothing to attribute\n";
  }
  // The table goes where the report goes: a file, or stderr (stdout is the command's).
  std::FILE* to = stderr;
  std::FILE* file = nullptr;
  if (!out_path.empty()) {
    file = std::fopen(out_path.c_str(), "w");
    TS_CHECK(file, "--out ", out_path, ": cannot write");
    to = file;
  }
  std::fputs(report.c_str(), to);
  if (!json && any) {
    std::fflush(to);
    explain::print_op_profile(rows, "total", static_cast<size_t>(top), to);
    std::fprintf(to, "scopes (wall time; the ops inside, nested scopes included):\n");
    for (const ops::ScopeTotal& s : observer.tally().scopes())
      std::fprintf(to,
                   "  %-12s %8lld calls %10.3f ms %6.1f%% of the ops' span; ops %.3f ms, "
                   "%.2f GFLOP, %.1f MB\n",
                   s.name.c_str(), static_cast<long long>(s.calls), s.seconds * 1e3,
                   window > 0 ? 100 * s.seconds / window : 0.0, s.op_seconds * 1e3, s.flops / 1e9,
                   s.bytes / 1e6);
  }
  if (file) TS_CHECK(std::fclose(file) == 0, "--out ", out_path, ": write failed");
  if (const std::string html = a.str("--html"); !html.empty()) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%.3f s in all: %.3f s before the first op, ops %.3f s and %.3f s between them "
                  "over %.3f s, %.3f s after the last",
                  t1 - t0, first - t0, sum.seconds, other, window, t1 - last);
    const std::vector<std::string> notes{"tessera " + joined(cmd), buf,
                                         "roofs: the probe of " + utc(peaks.probed_at) + " (load " +
                                             std::to_string(peaks.load_at_probe).substr(0, 4) +
                                             " on " + std::to_string(peaks.cores) + " cores), " +
                                             peaks.cpu};
    std::ofstream f(html);
    f << explain::profile_html("profile: tessera " + name, notes, rows, explain::roof_lines(peaks));
    TS_CHECK(f.good(), "--html ", html, ": cannot write");
  }
  return rc;
}

const Registrar reg{Command{
    "profile",
    "run a command and report its time per op (shape, type, scope) against the roofline",
    {Flag::integer("--steps", 0, 0, 1000000,
                   "train: run this many steps (replaces the command's --steps); 0: its own"),
     Flag::number("--seconds", 0.0, 0.0, 1e6,
                  "serve: SIGTERM (it drains) after this many seconds; 0: never"),
     Flag::toggle("--json", "the report as JSON"),
     Flag::text("--out", "", "write the report to PATH instead of stderr", "PATH"),
     Flag::text("--html", "", "also write the report as a page: the table and a roofline chart",
                "PATH"),
     Flag::integer("--top", 30, 0, 100000,
                   "op rows in the table, the rest summed in one (0: all; JSON has all)")},
    {},
    run,
    {},
    true}};

}  // namespace
}  // namespace tessera::cli
