// RAPL from sysfs, NVML through dlopen.
#include "profile/power.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace tessera::profile {

namespace {

bool read_number(const std::string& path, double* v) {
  std::ifstream in(path);
  return static_cast<bool>(in >> *v);
}

// NVML's entry points, resolved once; null when the library or a GPU is missing.
struct Nvml {
  using Init = int (*)();
  using Count = int (*)(unsigned*);
  using Handle = int (*)(unsigned, void**);
  using Energy = int (*)(void*, unsigned long long*);  // millijoules since the driver loaded
  Energy energy = nullptr;
  std::vector<void*> devices;
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
    auto count = reinterpret_cast<Count>(dlsym(lib, "nvmlDeviceGetCount_v2"));
    auto handle = reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy = reinterpret_cast<Energy>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    unsigned n = 0;
    if (!init || !count || !handle || !energy || init() != 0 || count(&n) != 0) {
      energy = nullptr;
      return;
    }
    for (unsigned i = 0; i < n; ++i) {
      void* d = nullptr;
      unsigned long long mj = 0;
      // A GPU older than Volta has no energy counter: NVML says so here.
      if (handle(i, &d) == 0 && energy(d, &mj) == 0) devices.push_back(d);
    }
    if (devices.empty()) energy = nullptr;
  }
};

const Nvml& nvml() {
  static const Nvml n;
  return n;
}

}  // namespace

EnergyMeter::EnergyMeter(std::string rapl_root, bool try_nvml) {
  // Package domains: intel-rapl:N (their subdomains, intel-rapl:N:M, are parts of them).
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(rapl_root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("intel-rapl:", 0) != 0 || std::count(name.begin(), name.end(), ':') != 1)
      continue;
    Counter c;
    c.path = (e.path() / "energy_uj").string();
    double uj = 0, range = 0;
    if (!read_number(c.path, &uj)) continue;  // unreadable without privileges on many systems
    c.range_j = read_number((e.path() / "max_energy_range_uj").string(), &range) ? range / 1e6 : 0;
    rapl_.push_back(c);
  }
  std::sort(rapl_.begin(), rapl_.end(),
            [](const Counter& a, const Counter& b) { return a.path < b.path; });
  if (!rapl_.empty())
    source_ = Source::rapl;
  else if (try_nvml && nvml().energy)
    source_ = Source::nvml;
}

const char* EnergyMeter::source_name() const {
  return source_ == Source::rapl ? "RAPL" : source_ == Source::nvml ? "NVML" : "none";
}

EnergySample EnergyMeter::sample() const {
  EnergySample s;
  if (source_ == Source::rapl) {
    for (const Counter& c : rapl_) {
      double uj = 0;
      if (!read_number(c.path, &uj)) return {};
      s.joules.push_back(uj / 1e6);
    }
  } else if (source_ == Source::nvml) {
    for (void* d : nvml().devices) {
      unsigned long long mj = 0;
      if (nvml().energy(d, &mj) != 0) return {};
      s.joules.push_back(static_cast<double>(mj) / 1e3);
    }
  }
  return s;
}

double EnergyMeter::joules_between(const EnergySample& a, const EnergySample& b) const {
  if (!a.ok() || !b.ok() || a.joules.size() != b.joules.size()) return -1;
  double j = 0;
  for (size_t i = 0; i < a.joules.size(); ++i) {
    double d = b.joules[i] - a.joules[i];
    if (d < 0 && source_ == Source::rapl && i < rapl_.size()) d += rapl_[i].range_j;  // wrapped
    j += std::max(d, 0.0);
  }
  return j;
}

std::string energy_text(double joules, double tokens, const char* source) {
  char buf[160];
  if (joules < 0)
    std::snprintf(buf, sizeof buf, "no power reading here (RAPL and NVML unreadable)");
  else if (tokens > 0)
    std::snprintf(buf, sizeof buf, "%.1f J (%.3g J/token, %s)", joules, joules / tokens, source);
  else
    std::snprintf(buf, sizeof buf, "%.1f J (%s)", joules, source);
  return buf;
}

}  // namespace tessera::profile
