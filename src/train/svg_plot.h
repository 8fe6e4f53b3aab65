// A hand-written SVG line chart (no library): axes with tick labels, any number of series, and a
// legend. Used for <out>/loss.svg.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tessera::train {

struct Series {
  std::string name, color;                        // color: any SVG color, e.g. "#1f77b4"
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite points are skipped
};

// Returns the SVG document. Throws Error if no series has a finite point.
std::string line_chart_svg(const std::vector<Series>& series, const std::string& title,
                           const std::string& x_label, const std::string& y_label);

// "Nice" tick positions (1, 2, 5 x 10^k spacing) covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target);

}  // namespace tessera::train
