// The machine probe's cache: JSON round trip (with and without the probe date and the format-2
// roofs), the freshness and busy-machine rules, the sysfs cache sizes and load average readers,
// each int8 loop, and cached_peaks using a fresh cache, re-measuring a stale, foreign or busy one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "profile/probe.h"
#include "profile/probe_loops.h"

namespace tessera::profile {
namespace {

MachinePeaks sample() {
  MachinePeaks p;
  p.cpu = "Test CPU @ 1 GHz";
  p.threads = 3;
  p.f32_gflops_all = 100, p.f32_gflops_one = 40;
  p.triad_gbs_all = 20, p.triad_gbs_one = 12;
  p.probed_at = 1'700'000'000;
  p.read_gbs_all = 15, p.read_gbs_one = 9;
  p.l2_bytes = 2 << 20, p.l3_bytes = int64_t{480} << 20;
  p.l2_gbs_all = 300, p.l2_gbs_one = 160;
  p.l3_gbs_all = 30, p.l3_gbs_one = 18;
  p.int8_gops_all = 1500, p.int8_gops_one = 700;
  p.int8_kind = "avx512-vnni vpdpbusd";
  p.load_at_probe = 0.25;
  p.cores = 4;
  return p;
}

// A private folder under the temp directory, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

void write_file(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

TEST(Probe, JsonRoundTripKeepsTheDate) {
  const MachinePeaks p = sample();
  const MachinePeaks q = peaks_from_json(peaks_to_json(p));
  EXPECT_EQ(q.cpu, p.cpu);
  EXPECT_EQ(q.threads, 3);
  EXPECT_EQ(q.triad_gbs_all, 20);
  EXPECT_EQ(q.probed_at, 1'700'000'000);
  EXPECT_EQ(q.format, kProbeFormat);
  EXPECT_EQ(q.read_gbs_all, 15);
  EXPECT_EQ(q.read_gbs_one, 9);
  EXPECT_EQ(q.l2_bytes, 2 << 20);
  EXPECT_EQ(q.l3_bytes, int64_t{480} << 20);
  EXPECT_EQ(q.l2_gbs_all, 300);
  EXPECT_EQ(q.l2_gbs_one, 160);
  EXPECT_EQ(q.l3_gbs_all, 30);
  EXPECT_EQ(q.l3_gbs_one, 18);
  EXPECT_EQ(q.int8_gops_all, 1500);
  EXPECT_EQ(q.int8_gops_one, 700);
  EXPECT_EQ(q.int8_kind, "avx512-vnni vpdpbusd");
  EXPECT_EQ(q.load_at_probe, 0.25);
  EXPECT_EQ(q.cores, 4);
  EXPECT_FALSE(probe_needs_remeasure(q, q.probed_at + 60, 0.0));
}

// A cache written before the roofs existed: it parses, reads as format 1, and is measured again
// however fresh it is.
TEST(Probe, CacheWithoutTheNewFieldsCountsAsStale) {
  const std::string old =
      R"({"cpu": "x", "threads": 2, "f32_gflops_all": 1, "f32_gflops_one": 1,
          "bf16_gflops_all": 0, "bf16_gflops_one": 0, "triad_gbs_all": 5, "triad_gbs_one": 4,
          "probed_at": 1700000000})";
  const MachinePeaks p = peaks_from_json(old);
  EXPECT_EQ(p.format, 1);
  EXPECT_EQ(p.read_gbs_all, 0);
  EXPECT_TRUE(probe_is_fresh(p, 1'700'000'060));
  EXPECT_TRUE(probe_needs_remeasure(p, 1'700'000'060, 0.0));
}

// A format-2 cache must hold every field: each one left out makes it malformed (and cached_peaks
// then measures again).
TEST(Probe, Format2CacheMissingAnyFieldIsMalformed) {
  const std::string full = peaks_to_json(sample());
  for (const char* key : {"cores", "int8_gops_all", "int8_gops_one", "int8_kind", "read_gbs_all",
                          "read_gbs_one", "l2_bytes", "l2_gbs_all", "l2_gbs_one", "l3_bytes",
                          "l3_gbs_all", "l3_gbs_one", "load_at_probe"}) {
    const std::string needle = std::string("\"") + key + "\":";
    const auto at = full.find(needle);
    ASSERT_NE(at, std::string::npos) << key;
    std::string broken = full;
    broken.replace(at, needle.size(), std::string("\"no_") + key + "\":");
    EXPECT_THROW(peaks_from_json(broken), Error) << key;
  }
}

// A probe taken while the load was above half the cores is measured again once the load has
// fallen by a quarter of the cores; a quiet probe never is for the load's sake.
TEST(Probe, BusyProbeIsRemeasuredWhenTheLoadFalls) {
  MachinePeaks p = sample();  // 4 cores
  const int64_t now = p.probed_at + 60;
  p.load_at_probe = 2.0;  // exactly half: not busy
  EXPECT_FALSE(probe_needs_remeasure(p, now, 0.0));
  p.load_at_probe = 3.5;  // busy
  EXPECT_TRUE(probe_needs_remeasure(p, now, 0.1));
  EXPECT_TRUE(probe_needs_remeasure(p, now, 2.4));
  EXPECT_FALSE(probe_needs_remeasure(p, now, 2.5)) << "one core freed of four: not enough";
  EXPECT_FALSE(probe_needs_remeasure(p, now, 3.4)) << "a drift, not a quieter machine";
  EXPECT_FALSE(probe_needs_remeasure(p, now, 3.5)) << "as busy now: a new reading reads as low";
  EXPECT_FALSE(probe_needs_remeasure(p, now, 6.0));
  p.load_at_probe = 0.3;
  EXPECT_FALSE(probe_needs_remeasure(p, now, 0.0));
  // Staleness still applies to a quiet probe.
  EXPECT_TRUE(probe_needs_remeasure(p, p.probed_at + kProbeMaxAgeSeconds + 1, 0.0));
}

TEST(Probe, ReadsCacheSizesFromSysfs) {
  const TempDir dir("tessera_sysfs_test");
  auto level = [&](const char* index, const char* lvl, const char* type, const char* size,
                   const char* shared) {
    write_file(dir.path / index / "level", lvl);
    write_file(dir.path / index / "type", type);
    write_file(dir.path / index / "size", size);
    write_file(dir.path / index / "shared_cpu_list", shared);
  };
  level("index0", "1", "Data", "48K", "0,8");
  level("index1", "1", "Instruction", "32K", "0,8");
  level("index2", "2", "Unified", "2048K", "0,8");
  level("index3", "3", "Unified", "32768K", "0-7,16-23");
  const CacheInfo ci = read_cache_info(dir.path.string(), 32);
  EXPECT_EQ(ci.l2_bytes, 2 << 20);
  EXPECT_EQ(ci.l2_sharing, 2);
  EXPECT_EQ(ci.l3_instance_bytes, 32 << 20);
  EXPECT_EQ(ci.l3_sharing, 16);
  EXPECT_EQ(ci.l3_bytes, int64_t{64} << 20) << "two L3 instances for 32 CPUs";

  const CacheInfo none = read_cache_info((dir.path / "absent").string(), 4);
  EXPECT_EQ(none.l2_bytes, 0);
  EXPECT_EQ(none.l3_bytes, 0);
  level("index2", "2", "Unified", "garbage", "0");
  EXPECT_EQ(read_cache_info(dir.path.string(), 32).l2_bytes, 0);
}

TEST(Probe, ReadsTheOneMinuteLoadAverage) {
  const TempDir dir("tessera_loadavg_test");
  write_file(dir.path / "loadavg", "1.92 0.96 0.51 3/384 32091");
  EXPECT_DOUBLE_EQ(read_load_average((dir.path / "loadavg").string()), 1.92);
  EXPECT_EQ(read_load_average((dir.path / "absent").string()), 0);
  EXPECT_GE(read_load_average(), 0);
}

// Every int8 dot-product loop this CPU has runs and counts its operations (the probe measures
// only the best one).
TEST(Probe, EachInt8LoopRuns) {
  const auto all = loops::int8_loops();
  for (const auto& c : all) {
    loops::ComputeLoop quick = c;
    quick.iters = 100'000;
    EXPECT_GT(loops::measure_ops(quick, 1), 0) << c.kind;
  }
  EXPECT_EQ(loops::int8_loop().kind, all.empty() ? "none" : all.front().kind);
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

// Runs the real probe (two or three seconds each time it measures on one thread) in a private
// cache directory.
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

  const MachinePeaks first = cached_peaks(1, now, 0.0);  // no cache: measures and writes it
  ASSERT_TRUE(std::filesystem::exists(file));
  EXPECT_EQ(first.probed_at, now);
  EXPECT_EQ(first.format, kProbeFormat);
  EXPECT_GT(first.cores, 0);
  EXPECT_GE(first.load_at_probe, 0);
  EXPECT_GT(first.triad_gbs_all, 0);
  EXPECT_GT(first.read_gbs_all, 0);
  EXPECT_GT(first.read_gbs_one, 0);
  EXPECT_TRUE(first.l2_bytes == 0 || first.l2_gbs_all > 0) << "L2 readable but not measured";
  EXPECT_TRUE(first.l3_bytes == 0 || first.l3_gbs_all > 0) << "L3 readable but not measured";
  EXPECT_TRUE(first.int8_kind == "none" || first.int8_gops_all > 0) << first.int8_kind;
  auto write = [&](MachinePeaks p) { std::ofstream(file) << peaks_to_json(p) << "\n"; };
  // A planted reading no machine gives: returned only while the cache is to be trusted.
  MachinePeaks planted = first;
  planted.triad_gbs_all = 1e7;
  planted.load_at_probe = 0;  // taken on a quiet machine
  write(planted);
  EXPECT_EQ(cached_peaks(1, now + 3600, 0.0).triad_gbs_all, 1e7);
  // Taken on a busy machine: kept while the load stays as high, measured again once it falls.
  planted.load_at_probe = 2.0 * planted.cores;
  write(planted);
  EXPECT_EQ(cached_peaks(1, now + 3600, 3.0 * planted.cores).triad_gbs_all, 1e7);
  const MachinePeaks quieter = cached_peaks(1, now + 3600, 0.0);
  EXPECT_LT(quieter.triad_gbs_all, 1e6);
  EXPECT_EQ(quieter.probed_at, now + 3600);
  planted.load_at_probe = 0;
  planted.probed_at = now - kProbeMaxAgeSeconds - 1;  // stale
  write(planted);
  const MachinePeaks again = cached_peaks(1, now, 0.0);
  EXPECT_LT(again.triad_gbs_all, 1e6);
  EXPECT_EQ(again.probed_at, now);
  std::stringstream ss;
  ss << std::ifstream(file).rdbuf();
  EXPECT_EQ(peaks_from_json(ss.str()).probed_at, now) << "the new reading was not cached";
  planted.probed_at = now;
  planted.threads = 2;  // another thread count: not this request's reading
  write(planted);
  EXPECT_LT(cached_peaks(1, now, 0.0).triad_gbs_all, 1e6);

  if (old_xdg)
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::profile
