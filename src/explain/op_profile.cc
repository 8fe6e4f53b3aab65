// Per-op profile rows from an OpTally's totals, judged against the machine's roofs, as a table or
// JSON.
#include "explain/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace tessera::explain {

namespace {

// The memory roof for data of `bytes`: the smallest measured level that holds them.
std::pair<double, std::string> memory_roof(const Roofs& r, double bytes) {
  if (r.l2_gbs > 0 && r.l2_bytes > 0 && bytes <= r.l2_bytes) return {r.l2_gbs, "L2"};
  if (r.l3_gbs > 0 && r.l3_bytes > 0 && bytes <= r.l3_bytes) return {r.l3_gbs, "L3"};
  return {r.memory_gbs, r.memory_name};
}

}  // namespace

Roofs cpu_roofs(const profile::MachinePeaks& p, int threads, double memory_gbs) {
  Roofs r;
  r.memory_gbs = memory_gbs > 0       ? memory_gbs
                 : p.read_gbs_all > 0 ? p.read_gbs_all
                                      : p.triad_gbs_all;
  r.l2_gbs = p.l2_gbs_all;
  r.l3_gbs = p.l3_gbs_all;
  r.l2_bytes = static_cast<double>(p.l2_bytes) * std::max(threads, 1);
  r.l3_bytes = static_cast<double>(p.l3_bytes);
  const double f32 = p.f32_gflops_all, bf16 = p.bf16_gflops_all, int8 = p.int8_gops_all;
  r.compute = [f32, bf16, int8](const ops::OpTotal& t) {
    const bool product = t.op.starts_with("matmul_wt");
    if (product && t.dtype == "bf16" && bf16 > 0) return ComputePeak{bf16, "bf16"};
    const bool quantized =
        !t.dtype.empty() && t.dtype != "f32" && t.dtype != "f16" && t.dtype != "bf16";
    if (product && quantized && int8 > 0) return ComputePeak{int8, "int8"};
    return ComputePeak{f32, "f32"};
  };
  return r;
}

RoofTime roof_time(const Roofs& roofs, const ops::OpTotal& t, double state_per_run) {
  RoofTime rt;
  const ComputePeak peak = roofs.compute ? roofs.compute(t) : ComputePeak{};
  const bool state = t.state_bytes >= 0.5 * t.bytes && t.state_bytes > 0;
  const auto [bw, level] = memory_roof(roofs, state         ? state_per_run
                                              : t.calls > 0 ? t.bytes / t.calls
                                                            : 0);
  rt.compute_s = peak.gflops > 0 ? t.flops / (peak.gflops * 1e9) : 0;
  rt.memory_s = bw > 0 ? t.bytes / (bw * 1e9) : 0;
  rt.compute_roof = peak.name;
  rt.memory_level = level;
  return rt;
}

std::vector<OpProfileRow> op_profile(const std::vector<ops::OpTotal>& totals, int64_t runs,
                                     double seconds, const Roofs& roofs) {
  std::vector<OpProfileRow> rows;
  const double n = static_cast<double>(std::max<int64_t>(runs, 1));
  double in_ops = 0, state_per_run = 0;
  for (const ops::OpTotal& t : totals) state_per_run += t.state_bytes / n;
  for (const ops::OpTotal& t : totals) {
    OpProfileRow r;
    r.op = t.op;
    r.shape = t.shape;
    r.dtype = t.dtype;
    r.scope = t.scope;
    r.calls = static_cast<double>(t.calls) / n;
    r.ms = t.seconds / n * 1e3;
    r.share = seconds > 0 ? t.seconds / seconds : 0;
    r.flops = t.flops / n;
    r.bytes = t.bytes / n;
    if (t.seconds > 0) {
      r.gflops = t.flops / t.seconds * 1e-9;
      r.gbs = t.bytes / t.seconds * 1e-9;
    }
    const RoofTime rt = roof_time(roofs, t, state_per_run);
    const double compute_s = rt.compute_s, memory_s = rt.memory_s;
    r.roof_ms = rt.seconds() / n * 1e3;
    if (r.roof_ms > 0) {
      const bool compute = rt.compute_bound();
      r.roof = rt.roof();
      const double roof_per_call = std::max(compute_s, memory_s) / std::max<double>(t.calls, 1);
      const bool overhead =
          r.roof_fraction() < kOverheadBelow && roof_per_call < kOverheadCallSeconds;
      r.verdict = overhead ? "overhead-bound" : compute ? "compute-bound" : "memory-bound";
    }
    in_ops += t.seconds;
    rows.push_back(std::move(r));
  }
  OpProfileRow other;
  other.op = "(other)";
  other.ms = std::max(0.0, seconds - in_ops) / n * 1e3;
  other.share = seconds > 0 ? std::max(0.0, seconds - in_ops) / seconds : 0;
  rows.push_back(other);
  return rows;
}

void print_op_profile(const std::vector<OpProfileRow>& rows, const char* per, size_t max_rows,
                      std::FILE* to) {
  std::fprintf(to, "  %-16s %-28s %-6s %-9s %8s %9s %6s %8s %8s %7s %5s %6s  %s\n", "op", "shape",
               "type", "scope", "calls", "ms", "share", "GFLOP/s", "GB/s", "FLOP/B", "roof",
               "%roof", "verdict");
  std::fprintf(to, "  %-16s %-28s %-6s %-9s %8s %9s\n", "", "", "", "", per, per);
  auto print = [to](const OpProfileRow& r) {
    std::fprintf(to, "  %-16s %-28s %-6s %-9s %8.1f %9.3f %5.1f%%", r.op.c_str(), r.shape.c_str(),
                 r.dtype.c_str(), r.scope.c_str(), r.calls, r.ms, 100.0 * r.share);
    if (r.roof_ms > 0 && r.ms > 0)
      std::fprintf(to, " %8.1f %8.1f %7.2f %5s %5.0f%%  %s\n", r.gflops, r.gbs, r.intensity(),
                   r.roof.c_str(), 100.0 * r.roof_fraction(), r.verdict.c_str());
    else
      std::fprintf(to, " %8s %8s %7s %5s %6s  %s\n", "-", "-", "-", "-", "-", "-");
  };
  const size_t ops = rows.empty() ? 0 : rows.size() - 1;  // the last row is (other)
  const size_t shown = max_rows > 0 ? std::min(ops, max_rows) : ops;
  for (size_t i = 0; i < shown; ++i) print(rows[i]);
  if (shown < ops) {
    OpProfileRow rest;
    rest.op = "(" + std::to_string(ops - shown) + " more)";
    for (size_t i = shown; i < ops; ++i) {
      rest.calls += rows[i].calls;
      rest.ms += rows[i].ms;
      rest.share += rows[i].share;
    }
    print(rest);
  }
  if (!rows.empty()) print(rows.back());
}

std::string op_profile_json(const std::vector<OpProfileRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const OpProfileRow& r : rows)
    out.push_back({{"op", r.op},
                   {"shape", r.shape},
                   {"dtype", r.dtype},
                   {"scope", r.scope},
                   {"calls", r.calls},
                   {"ms", r.ms},
                   {"share", r.share},
                   {"flops", r.flops},
                   {"bytes", r.bytes},
                   {"intensity", r.intensity()},
                   {"gflops", r.gflops},
                   {"gbs", r.gbs},
                   {"roof_ms", r.roof_ms},
                   {"roof", r.roof},
                   {"roof_fraction", r.roof_fraction()},
                   {"verdict", r.verdict}});
  return out.dump();
}

}  // namespace tessera::explain
