// SVG line chart: layout, tick computation and escaping.
#include "train/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace tessera::train {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string line_chart_svg(const std::vector<Series>& series, const std::string& title,
                           const std::string& x_label, const std::string& y_label) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  TS_CHECK(std::isfinite(x0), "[plot] '", title, "': no finite points to plot");
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double ypad = 0.05 * (y1 - y0);
  y0 -= ypad, y1 += ypad;
  const std::vector<double> xt = nice_ticks(x0, x1, 6), yt = nice_ticks(y0, y1, 6);

  // Plot area inside a 720x440 canvas, margins sized for the tick labels.
  const double W = 720, H = 440, left = 70, right = 20, top = 40, bottom = 55;
  const double pw = W - left - right, ph = H - top - bottom;
  auto sx = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto sy = [&](double y) { return top + (1.0 - (y - y0) / (y1 - y0)) * ph; };

  std::string o =
      cat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", W, "\" height=\"", H,
          "\" viewBox=\"0 0 ", W, " ", H, "\" font-family=\"sans-serif\" font-size=\"12\">\n");
  o += cat("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  o += cat("<text x=\"", W / 2, "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", esc(title),
           "</text>\n");
  for (double v : xt) {
    if (v < x0 || v > x1) continue;
    o += cat("<line x1=\"", px(sx(v)), "\" y1=\"", top, "\" x2=\"", px(sx(v)), "\" y2=\"", top + ph,
             "\" stroke=\"#e5e5e5\"/>\n");
    o += cat("<text x=\"", px(sx(v)), "\" y=\"", top + ph + 18, "\" text-anchor=\"middle\">",
             num(v), "</text>\n");
  }
  for (double v : yt) {
    if (v < y0 || v > y1) continue;
    o += cat("<line x1=\"", left, "\" y1=\"", px(sy(v)), "\" x2=\"", left + pw, "\" y2=\"",
             px(sy(v)), "\" stroke=\"#e5e5e5\"/>\n");
    o += cat("<text x=\"", left - 6, "\" y=\"", px(sy(v) + 4), "\" text-anchor=\"end\">", num(v),
             "</text>\n");
  }
  o += cat("<rect x=\"", left, "\" y=\"", top, "\" width=\"", pw, "\" height=\"", ph,
           "\" fill=\"none\" stroke=\"black\"/>\n");
  o += cat("<text x=\"", left + pw / 2, "\" y=\"", H - 12, "\" text-anchor=\"middle\">",
           esc(x_label), "</text>\n");
  o += cat("<text transform=\"translate(16,", top + ph / 2,
           ") rotate(-90)\" text-anchor=\"middle\">", esc(y_label), "</text>\n");
  int legend_row = 0;
  for (const auto& s : series) {
    std::string pts;
    int n = 0;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      pts += cat(n++ ? " " : "", px(sx(x)), ",", px(sy(y)));
    }
    if (n == 0) continue;
    if (n == 1) {
      o += cat("<circle cx=\"", pts.substr(0, pts.find(',')), "\" cy=\"",
               pts.substr(pts.find(',') + 1), "\" r=\"3\" fill=\"", s.color, "\"/>\n");
    } else {
      o += cat("<polyline fill=\"none\" stroke=\"", s.color, "\" stroke-width=\"1.5\" points=\"",
               pts, "\"/>\n");
    }
    const double ly = top + 14 + 18 * legend_row++;
    o += cat("<line x1=\"", left + pw - 130, "\" y1=\"", ly - 4, "\" x2=\"", left + pw - 105,
             "\" y2=\"", ly - 4, "\" stroke=\"", s.color, "\" stroke-width=\"2\"/>\n");
    o += cat("<text x=\"", left + pw - 100, "\" y=\"", ly, "\">", esc(s.name), "</text>\n");
  }
  o += "</svg>\n";
  return o;
}

}  // namespace tessera::train
