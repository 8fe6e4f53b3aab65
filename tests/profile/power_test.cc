// The energy meter on a fake powercap tree: package domains only (not their subdomains), joules
// summed over packages, a counter's wrap undone; no tree and no GPU: no source, and readings
// that say so.
#include "profile/power.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace tessera::profile {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

TEST(EnergyMeter, RaplPackagesSummedAndWrapsUndone) {
  const fs::path root = fs::path(::testing::TempDir()) / "tessera_fake_powercap";
  fs::remove_all(root);
  write(root / "intel-rapl:0" / "energy_uj", "1000000");             // 1 J
  write(root / "intel-rapl:0" / "max_energy_range_uj", "10000000");  // wraps at 10 J
  write(root / "intel-rapl:1" / "energy_uj", "9500000");             // 9.5 J, about to wrap
  write(root / "intel-rapl:1" / "max_energy_range_uj", "10000000");
  write(root / "intel-rapl:0:0" / "energy_uj", "123");  // a subdomain: part of package 0
  const EnergyMeter m(root.string(), /*try_nvml=*/false);
  ASSERT_EQ(m.source(), EnergyMeter::Source::rapl);
  EXPECT_STREQ(m.source_name(), "RAPL");
  const EnergySample a = m.sample();
  ASSERT_EQ(a.joules.size(), 2u);
  write(root / "intel-rapl:0" / "energy_uj", "3500000");  // +2.5 J
  write(root / "intel-rapl:1" / "energy_uj", "500000");   // wrapped: +1 J
  const EnergySample b = m.sample();
  EXPECT_NEAR(m.joules_between(a, b), 3.5, 1e-9);
  EXPECT_EQ(energy_text(3.5, 7, "RAPL"), "3.5 J (0.5 J/token, RAPL)");
  fs::remove_all(root);
}

TEST(EnergyMeter, NothingReadableSaysSo) {
  const EnergyMeter m("/nonexistent/powercap", /*try_nvml=*/false);
  EXPECT_EQ(m.source(), EnergyMeter::Source::none);
  EXPECT_FALSE(m.sample().ok());
  EXPECT_EQ(m.joules_between(m.sample(), m.sample()), -1);
  EXPECT_NE(energy_text(-1, 10, "none").find("no power reading"), std::string::npos);
}

}  // namespace
}  // namespace tessera::profile
