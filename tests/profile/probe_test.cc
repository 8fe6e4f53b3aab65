// The machine probe's cache: JSON round trip (with and without the probe date), the freshness
// rule, and cached_peaks using a fresh cache, re-measuring a stale or foreign one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "profile/probe.h"

namespace tessera::profile {
namespace {

MachinePeaks sample() {
  MachinePeaks p;
  p.cpu = "Test CPU @ 1 GHz";
  p.threads = 3;
  p.f32_gflops_all = 100, p.f32_gflops_one = 40;
  p.triad_gbs_all = 20, p.triad_gbs_one = 12;
  p.probed_at = 1'700'000'000;
  return p;
}

TEST(Probe, JsonRoundTripKeepsTheDate) {
  const MachinePeaks p = sample();
  const MachinePeaks q = peaks_from_json(peaks_to_json(p));
  EXPECT_EQ(q.cpu, p.cpu);
  EXPECT_EQ(q.threads, 3);
  EXPECT_EQ(q.triad_gbs_all, 20);
  EXPECT_EQ(q.probed_at, 1'700'000'000);
}

TEST(Probe, CacheWithoutADateReadsAsUndated) {
  const std::string old =
      R"({"cpu": "x", "threads": 2, "f32_gflops_all": 1, "f32_gflops_one": 1,
          "bf16_gflops_all": 0, "bf16_gflops_one": 0, "triad_gbs_all": 5, "triad_gbs_one": 4})";
  const MachinePeaks p = peaks_from_json(old);
  EXPECT_EQ(p.probed_at, 0);
  EXPECT_FALSE(probe_is_fresh(p, 1'700'000'000));
  EXPECT_THROW(peaks_from_json(R"({"cpu": "x", "threads": 2})"), Error);
}

TEST(Probe, FreshnessIsAWeekAndNeverTheFuture) {
  MachinePeaks p = sample();
  const int64_t t = p.probed_at;
  EXPECT_TRUE(probe_is_fresh(p, t));
  EXPECT_TRUE(probe_is_fresh(p, t + kProbeMaxAgeSeconds));
  EXPECT_FALSE(probe_is_fresh(p, t + kProbeMaxAgeSeconds + 1));
  EXPECT_FALSE(probe_is_fresh(p, t - 1));  // probed "after" now: the clock moved back
  p.probed_at = 0;
  EXPECT_FALSE(probe_is_fresh(p, t));
}

// Runs the real probe (about two seconds each time it measures) in a private cache directory.
TEST(Probe, CachedPeaksUseAFreshCacheAndRemeasureAStaleOne) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessera_probe_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  const std::filesystem::path file = dir / "tessera" / "probe.json";
  const int64_t now = 1'800'000'000;

  const MachinePeaks first = cached_peaks(1, now);  // no cache: measures and writes it
  ASSERT_TRUE(std::filesystem::exists(file));
  EXPECT_EQ(first.probed_at, now);
  EXPECT_GT(first.triad_gbs_all, 0);
  auto write = [&](MachinePeaks p) { std::ofstream(file) << peaks_to_json(p) << "\n"; };
  // A planted reading no machine gives: returned only while the cache is to be trusted.
  MachinePeaks planted = first;
  planted.triad_gbs_all = 1e7;
  write(planted);
  EXPECT_EQ(cached_peaks(1, now + 3600).triad_gbs_all, 1e7);
  planted.probed_at = now - kProbeMaxAgeSeconds - 1;  // stale
  write(planted);
  const MachinePeaks again = cached_peaks(1, now);
  EXPECT_LT(again.triad_gbs_all, 1e6);
  EXPECT_EQ(again.probed_at, now);
  std::stringstream ss;
  ss << std::ifstream(file).rdbuf();
  EXPECT_EQ(peaks_from_json(ss.str()).probed_at, now) << "the new reading was not cached";
  planted.probed_at = now;
  planted.threads = 2;  // another thread count: not this request's reading
  write(planted);
  EXPECT_LT(cached_peaks(1, now).triad_gbs_all, 1e6);

  if (old_xdg)
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::profile
