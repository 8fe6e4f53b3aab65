// Per-op profile rows from an OpTally, as a table or JSON.
#include "apps/cli/op_profile.h"

#include <algorithm>
#include <cstdio>

namespace tessera::cli {

std::vector<OpProfileRow> op_profile(const std::vector<ops::OpTotal>& totals, int64_t runs,
                                     double seconds,
                                     const std::function<double(const std::string&)>& peak_gflops,
                                     double bandwidth_gbs) {
  std::vector<OpProfileRow> rows;
  const double n = static_cast<double>(std::max<int64_t>(runs, 1));
  double in_ops = 0;
  for (const ops::OpTotal& t : totals) {
    OpProfileRow r;
    r.op = t.op;
    r.calls = static_cast<double>(t.calls) / n;
    r.ms = t.seconds / n * 1e3;
    r.share = seconds > 0 ? t.seconds / seconds : 0;
    if (t.seconds > 0) {
      r.gflops = t.flops / t.seconds * 1e-9;
      r.gbs = t.bytes / t.seconds * 1e-9;
    }
    const double peak = peak_gflops(t.op);
    const double compute_s = peak > 0 ? t.flops / (peak * 1e9) : 0;
    const double memory_s = bandwidth_gbs > 0 ? t.bytes / (bandwidth_gbs * 1e9) : 0;
    r.roof_ms = std::max(compute_s, memory_s) / n * 1e3;
    if (r.roof_ms > 0) r.bound = compute_s >= memory_s ? "compute" : "memory";
    in_ops += t.seconds;
    rows.push_back(r);
  }
  OpProfileRow other;
  other.op = "(other)";
  other.ms = std::max(0.0, seconds - in_ops) / n * 1e3;
  other.share = seconds > 0 ? std::max(0.0, seconds - in_ops) / seconds : 0;
  rows.push_back(other);
  return rows;
}

void print_op_profile(const std::vector<OpProfileRow>& rows, const char* per) {
  std::printf("  %-22s %9s %10s %7s %10s %9s %10s %8s\n", "op", "calls", "ms", "share", "GFLOP/s",
              "GB/s", "% of roof", "bound");
  std::printf("  %-22s %9s %10s\n", "", per, per);
  for (const OpProfileRow& r : rows) {
    std::printf("  %-22s %9.1f %10.3f %6.1f%%", r.op.c_str(), r.calls, r.ms, 100.0 * r.share);
    if (r.roof_ms > 0 && r.ms > 0)
      std::printf(" %10.1f %9.1f %9.1f%% %8s\n", r.gflops, r.gbs, 100.0 * r.roof_ms / r.ms,
                  r.bound);
    else
      std::printf(" %10s %9s %10s %8s\n", "-", "-", "-", "-");
  }
}

std::string op_profile_json(const std::vector<OpProfileRow>& rows) {
  std::string s = "[";
  char buf[512];
  for (size_t i = 0; i < rows.size(); ++i) {
    const OpProfileRow& r = rows[i];
    std::snprintf(buf, sizeof buf,
                  "%s{\"op\": \"%s\", \"calls\": %.2f, \"ms\": %.4f, \"share\": %.4f, "
                  "\"gflops\": %.2f, \"gbs\": %.2f, \"roof_ms\": %.4f, \"bound\": \"%s\"}",
                  i ? ", " : "", r.op.c_str(), r.calls, r.ms, r.share, r.gflops, r.gbs, r.roof_ms,
                  r.bound);
    s += buf;
  }
  return s + "]";
}

}  // namespace tessera::cli
