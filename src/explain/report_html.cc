// The report page: HTML with inline SVG, built as text.
#include "explain/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "jinja/py_string.h"

namespace tessera::explain {

namespace {

// Text into HTML: the one escape the project has (markupsafe's, for chat templates).
std::string escape(const std::string& s) {
  return jinja::html_escape(s);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

const char* kStyle =
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;text-align:right}"
    "td:first-child,th:first-child,td.l{text-align:left}tr:nth-child(even){background:#f4f4f4}"
    "svg text{font-size:11px;fill:#333}.roof{stroke-width:1.5;fill:none}"
    ".mem{stroke:#1f77b4}.cmp{stroke:#d62728}circle.op{fill:#ff7f0e;fill-opacity:.6;"
    "stroke:#a34f00}circle.knee{fill:none;stroke:#d62728;stroke-width:2}"
    ".curve{stroke:#2ca02c;stroke-width:2;fill:none}";

// A log-log frame: x in [x0, x1], y in [y0, y1], decades labelled.
struct LogFrame {
  double x0, x1, y0, y1;
  double w = 640, h = 400, left = 60, bottom = 40, top = 10, right = 20;
  double px(double x) const {
    return left + (std::log10(x) - std::log10(x0)) / (std::log10(x1) - std::log10(x0)) *
                      (w - left - right);
  }
  double py(double y) const {
    return h - bottom -
           (std::log10(y) - std::log10(y0)) / (std::log10(y1) - std::log10(y0)) *
               (h - bottom - top);
  }
  std::string axes(const std::string& xlabel, const std::string& ylabel) const {
    std::string s = "<rect x='" + fmt("%.1f", left) + "' y='" + fmt("%.1f", top) + "' width='" +
                    fmt("%.1f", w - left - right) + "' height='" + fmt("%.1f", h - top - bottom) +
                    "' fill='none' stroke='#999'/>";
    for (double d = std::pow(10, std::ceil(std::log10(x0))); d <= x1 * 1.0001; d *= 10)
      s += "<text x='" + fmt("%.1f", px(d)) + "' y='" + fmt("%.1f", h - bottom + 14) +
           "' text-anchor='middle'>" + fmt("%g", d) + "</text>";
    for (double d = std::pow(10, std::ceil(std::log10(y0))); d <= y1 * 1.0001; d *= 10)
      s += "<text x='" + fmt("%.1f", left - 4) + "' y='" + fmt("%.1f", py(d) + 4) +
           "' text-anchor='end'>" + fmt("%g", d) + "</text>";
    s += "<text x='" + fmt("%.1f", (left + w - right) / 2) + "' y='" + fmt("%.1f", h - 6) +
         "' text-anchor='middle'>" + escape(xlabel) + "</text>";
    s += "<text transform='rotate(-90)' x='" + fmt("%.1f", -(top + h - bottom) / 2) +
         "' y='14' text-anchor='middle'>" + escape(ylabel) + "</text>";
    return s;
  }
};

// The roofline chart: roofs as lines, one circle per point (intensity, GFLOP/s, share).
struct Point {
  std::string label;
  double intensity, gflops, share;
};

std::string roofline_svg(const RoofLines& roofs, const std::vector<Point>& points) {
  double peak = 1;
  for (const auto& [n, g] : roofs.compute) peak = std::max(peak, g);
  for (const Point& p : points) peak = std::max(peak, p.gflops);
  LogFrame f{1e-2, 1e3, 1e-2, std::pow(10, std::ceil(std::log10(peak * 2)))};
  std::string s =
      "<svg id='roofline' xmlns='http://www.w3.org/2000/svg' width='640' "
      "height='400'>" +
      f.axes("arithmetic intensity (FLOP/byte)", "GFLOP/s");
  for (const auto& [name, gbs] : roofs.memory) {
    if (gbs <= 0) continue;
    // y = gbs * x, clipped to the frame.
    const double xa = std::max(f.x0, f.y0 / gbs), xb = std::min(f.x1, f.y1 / gbs);
    if (xa >= xb) continue;
    s += "<line class='roof mem' x1='" + fmt("%.1f", f.px(xa)) + "' y1='" +
         fmt("%.1f", f.py(gbs * xa)) + "' x2='" + fmt("%.1f", f.px(xb)) + "' y2='" +
         fmt("%.1f", f.py(gbs * xb)) + "'><title>" + escape(name) + " " + fmt("%.1f", gbs) +
         " GB/s</title></line><text x='" + fmt("%.1f", f.px(xa) + 4) + "' y='" +
         fmt("%.1f", f.py(gbs * xa) - 4) + "'>" + escape(name) + "</text>";
  }
  for (const auto& [name, g] : roofs.compute) {
    if (g <= 0) continue;
    s += "<line class='roof cmp' x1='" + fmt("%.1f", f.px(f.x0)) + "' y1='" + fmt("%.1f", f.py(g)) +
         "' x2='" + fmt("%.1f", f.px(f.x1)) + "' y2='" + fmt("%.1f", f.py(g)) + "'><title>" +
         escape(name) + " " + fmt("%.0f", g) + " GFLOP/s</title></line><text x='" +
         fmt("%.1f", f.px(f.x1) - 4) + "' y='" + fmt("%.1f", f.py(g) - 4) + "' text-anchor='end'>" +
         escape(name) + "</text>";
  }
  for (const Point& p : points) {
    // Ops with no FLOPs or no time sit on the frame's edge rather than off the log scale.
    const double x = std::clamp(p.intensity, f.x0, f.x1), y = std::clamp(p.gflops, f.y0, f.y1);
    const double r = 3 + 25 * std::sqrt(std::max(0.0, p.share));  // area ~ share of the time
    s += "<circle class='op' cx='" + fmt("%.1f", f.px(x)) + "' cy='" + fmt("%.1f", f.py(y)) +
         "' r='" + fmt("%.1f", r) + "'><title>" + escape(p.label) + "</title></circle>";
  }
  return s + "</svg>";
}

std::string page(const std::string& title, const std::vector<std::string>& notes,
                 const std::string& body) {
  std::string s = "<!doctype html><html><head><meta charset='utf-8'><title>" + escape(title) +
                  "</title><style>" + kStyle + "</style></head><body><h1>" + escape(title) +
                  "</h1>";
  for (const std::string& n : notes) s += "<p>" + escape(n) + "</p>";
  return s + body + "</body></html>\n";
}

}  // namespace

RoofLines roof_lines(const profile::MachinePeaks& p) {
  RoofLines r;
  r.memory.emplace_back("DRAM read", p.read_gbs_all > 0 ? p.read_gbs_all : p.triad_gbs_all);
  if (p.l2_gbs_all > 0) r.memory.emplace_back("L2", p.l2_gbs_all);
  if (p.l3_gbs_all > 0) r.memory.emplace_back("L3", p.l3_gbs_all);
  r.compute.emplace_back("f32 FMA", p.f32_gflops_all);
  if (p.bf16_gflops_all > 0) r.compute.emplace_back("bf16 dot", p.bf16_gflops_all);
  if (p.int8_gops_all > 0) r.compute.emplace_back("int8 dot", p.int8_gops_all);
  return r;
}

std::string profile_html(const std::string& title, const std::vector<std::string>& notes,
                         const std::vector<OpProfileRow>& rows, const RoofLines& roofs) {
  std::vector<Point> points;
  std::string table =
      "<table id='ops'><tr><th>op</th><th>shape</th><th>type</th><th>scope</th><th>calls</th>"
      "<th>ms</th><th>share</th><th>GFLOP/s</th><th>GB/s</th><th>FLOP/B</th><th>roof</th>"
      "<th>% of roof</th><th>verdict</th></tr>";
  for (size_t i = 0; i < rows.size(); ++i) {
    const OpProfileRow& r = rows[i];
    const bool other = i + 1 == rows.size() && r.op == "(other)";
    table += "<tr><td>" + escape(r.op) + "</td><td class='l'>" + escape(r.shape) +
             "</td><td class='l'>" + escape(r.dtype) + "</td><td class='l'>" + escape(r.scope) +
             "</td><td>" + fmt("%.0f", r.calls) + "</td><td>" + fmt("%.3f", r.ms) + "</td><td>" +
             fmt("%.1f%%", 100 * r.share) + "</td>";
    if (other) {
      table += "<td colspan='6'></td></tr>";
      continue;
    }
    table += "<td>" + fmt("%.1f", r.gflops) + "</td><td>" + fmt("%.1f", r.gbs) + "</td><td>" +
             fmt("%.2f", r.intensity()) + "</td><td>" + escape(r.roof) + "</td><td>" +
             fmt("%.0f%%", 100 * r.roof_fraction()) + "</td><td class='l'>" + escape(r.verdict) +
             "</td></tr>";
    points.push_back({r.op + " " + r.shape + " " + r.dtype + " " + r.scope + ": " +
                          fmt("%.1f", r.gflops) + " GFLOP/s, " + fmt("%.1f%%", 100 * r.share),
                      r.intensity(), r.gflops, r.share});
  }
  table += "</table>";
  return page(title, notes, roofline_svg(roofs, points) + table);
}

std::string plan_html(const std::string& title, const std::vector<std::string>& notes,
                      const Plan& plan, const RoofLines& roofs) {
  // The roofline: the largest decode step's ops at their predicted rates.
  std::vector<Point> points;
  if (!plan.decode.empty()) {
    const StepPrediction& s = plan.decode.back();
    for (const OpPrediction& o : s.ops) {
      const double sec = o.seconds();
      points.push_back({o.op.op + " " + o.op.shape + " " + o.op.dtype,
                        o.op.bytes > 0 ? o.op.flops / o.op.bytes : 0,
                        sec > 0 ? o.op.flops / sec * 1e-9 : 0,
                        s.seconds > 0 ? sec / s.seconds : 0});
    }
  }
  // Decode tokens/s against the batch, the knee circled.
  std::string curve;
  if (!plan.sweep.empty()) {
    double ymax = 1, ymin = 1e30;
    for (const StepPrediction& s : plan.sweep) {
      ymax = std::max(ymax, s.tokens_per_s);
      ymin = std::min(ymin, s.tokens_per_s);
    }
    LogFrame f{1, static_cast<double>(std::max<int64_t>(2, plan.sweep.back().sequences)),
               std::pow(10, std::floor(std::log10(std::max(ymin, 1e-3)))),
               std::pow(10, std::ceil(std::log10(ymax * 1.5)))};
    curve = "<svg id='throughput' xmlns='http://www.w3.org/2000/svg' width='640' height='400'>" +
            f.axes("sequences decoding together", "predicted decode tokens/s") +
            "<polyline class='curve' points='";
    for (const StepPrediction& s : plan.sweep)
      curve += fmt("%.1f", f.px(static_cast<double>(s.sequences))) + "," +
               fmt("%.1f", f.py(s.tokens_per_s)) + " ";
    curve += "'/>";
    for (const StepPrediction& s : plan.sweep)
      if (s.sequences == plan.knee_batch)
        curve += "<circle class='knee' cx='" + fmt("%.1f", f.px(static_cast<double>(s.sequences))) +
                 "' cy='" + fmt("%.1f", f.py(s.tokens_per_s)) +
                 "' r='8'><title>knee: " + escape(plan.knee_reason) + "</title></circle>";
    curve += "</svg>";
  }
  std::string table =
      "<table id='decode'><tr><th>batch</th><th>tokens/s</th><th>step ms</th><th>weights</th>"
      "<th>KV cache</th><th>compute</th><th>overhead</th><th>bound</th></tr>";
  for (const StepPrediction& s : plan.decode)
    table += "<tr><td>" + std::to_string(s.sequences) + "</td><td>" + fmt("%.1f", s.tokens_per_s) +
             "</td><td>" + fmt("%.3f", s.seconds * 1e3) + "</td><td>" +
             fmt("%.0f%%", 100 * s.weights_s / s.seconds) + "</td><td>" +
             fmt("%.0f%%", 100 * s.kv_s / s.seconds) + "</td><td>" +
             fmt("%.0f%%", 100 * s.compute_s / s.seconds) + "</td><td>" +
             fmt("%.0f%%", 100 * s.overhead_s / s.seconds) + "</td><td class='l'>" +
             escape(s.bound) + "</td></tr>";
  table += "</table>";
  return page(title, notes, curve + roofline_svg(roofs, points) + table);
}

}  // namespace tessera::explain
