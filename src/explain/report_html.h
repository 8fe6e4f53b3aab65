// One self-contained HTML page for a profile or a plan: the table, a log-log roofline chart in
// inline SVG (the machine's roofs as lines, every op row a point at its arithmetic intensity and
// achieved (or predicted) rate, its area its share of the time), and for a plan the decode
// throughput against the batch with the knee marked. No script, nothing loaded from elsewhere.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "explain/op_profile.h"
#include "explain/plan.h"

namespace tessera::explain {

// The roofs drawn: memory levels (name, GB/s) as slanted lines, compute peaks (name, GFLOP/s)
// as flat ones.
struct RoofLines {
  std::vector<std::pair<std::string, double>> memory, compute;
};
RoofLines roof_lines(const profile::MachinePeaks& p);

// rows: op_profile's (the last, "(other)", is a table row but no point); notes: lines shown
// above the table (the command, its time, the probe).
std::string profile_html(const std::string& title, const std::vector<std::string>& notes,
                         const std::vector<OpProfileRow>& rows, const RoofLines& roofs);
std::string plan_html(const std::string& title, const std::vector<std::string>& notes,
                      const Plan& plan, const RoofLines& roofs);

}  // namespace tessera::explain
