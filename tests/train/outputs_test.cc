// Run outputs: SVG chart ticks and structure, progress-line formatting, token sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "train/progress.h"
#include "train/svg_plot.h"

namespace tessera::train {
namespace {

TEST(SvgPlot, NiceTicks) {
  const auto t = nice_ticks(0, 100, 5);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.front(), 0);
  EXPECT_EQ(t.back(), 100);
  EXPECT_EQ(t[1] - t[0], 20);
  const auto u = nice_ticks(2.13, 4.87, 6);  // step 0.5: 2.5 .. 4.5
  EXPECT_NEAR(u.front(), 2.5, 1e-12);
  EXPECT_NEAR(u.back(), 4.5, 1e-12);
}

TEST(SvgPlot, ChartHasCurvesLabelsAndLegend) {
  Series a{"train", "#1f77b4", {{0, 4.0}, {10, 3.0}, {20, 2.5}}};
  Series b{"validation", "#d62728", {{10, 3.2}, {20, NAN}}};
  const std::string s = line_chart_svg({a, b}, "Loss <x>", "step", "loss");
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_NE(s.find("<polyline"), std::string::npos);  // train curve
  EXPECT_NE(s.find("<circle"), std::string::npos);    // the single finite validation point
  EXPECT_NE(s.find(">train<"), std::string::npos);
  EXPECT_NE(s.find(">validation<"), std::string::npos);
  EXPECT_NE(s.find("Loss &lt;x&gt;"), std::string::npos);
  EXPECT_NE(s.find(">20<"), std::string::npos);  // an x tick label
  EXPECT_THROW(line_chart_svg({Series{"x", "red", {{NAN, 1}}}}, "t", "x", "y"), Error);
}

TEST(Progress, LineShowsRatesAndPeakFraction) {
  // 1e9 FLOPs per token at 50 tokens/s = 50 GFLOP/s, which is 25% of a 200 GFLOP/s peak.
  Progress p(nullptr, false, 1, 1e9, 200.0);
  ProgressStats s{10, 100, 2.5, 3e-4, 50.0, 1.0, 5.0};
  p.update(s, 2.0);  // 2 s per step, 90 steps left: ETA 3m00s
  const std::string line = p.format(s);
  EXPECT_NE(line.find("step 10/100"), std::string::npos) << line;
  EXPECT_NE(line.find("loss 2.5000"), std::string::npos) << line;
  EXPECT_NE(line.find("50.0 GFLOP/s (25%)"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 3m00s"), std::string::npos) << line;
  EXPECT_EQ(format_duration(3725), "1h02m");
}

}  // namespace
}  // namespace tessera::train
