// Energy a run used, where the machine lets a process read it: Linux RAPL counters
// (/sys/class/powercap/intel-rapl:N/energy_uj, one per CPU package; microjoules that wrap at
// max_energy_range_uj) on the CPU, NVML's total energy counter (libnvidia-ml, opened with dlopen
// on first use, never linked) on an NVIDIA GPU. Where neither is readable (most VMs), readings
// say so and callers ask for a stated power instead of guessing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::profile {

// One reading of every counter a source has, in joules since an arbitrary origin.
struct EnergySample {
  std::vector<double> joules;
  bool ok() const { return !joules.empty(); }
};

class EnergyMeter {
 public:
  enum class Source { none, rapl, nvml };
  // rapl_root: where the powercap tree is (tests point it at a fake one).
  explicit EnergyMeter(std::string rapl_root = "/sys/class/powercap", bool try_nvml = true);
  Source source() const { return source_; }
  const char* source_name() const;
  // A reading now (empty where there is no source).
  EnergySample sample() const;
  // Joules between two readings of this meter, each counter's wrap undone (at most once: a
  // package at 200 W wraps its 262 kJ range in about 20 minutes). -1 when either is empty.
  double joules_between(const EnergySample& a, const EnergySample& b) const;

 private:
  struct Counter {
    std::string path;    // energy_uj
    double range_j = 0;  // max_energy_range_uj / 1e6
  };
  Source source_ = Source::none;
  std::vector<Counter> rapl_;
};

// Power a caller states, or measured: joules / seconds. Text for reports:
// "812 J (21.3 J/token, RAPL)" or "no power reading here (RAPL and NVML unreadable)".
std::string energy_text(double joules, double tokens, const char* source);

}  // namespace tessera::profile
