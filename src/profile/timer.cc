// Process memory readings for reports.
#include "profile/timer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

namespace tessera::profile {

long long peak_rss_bytes() {
  // VmHWM honours reset_peak_rss(); getrusage's maxrss does not, so it is only the fallback.
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
    std::fclose(f);
    if (kib >= 0) return kib * 1024;
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<long long>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

void reset_peak_rss() {
  if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);  // 5: reset the peak resident set size to the current one
    std::fclose(f);
  }
}

long long current_rss_bytes() {
  long long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (std::fscanf(f, "%lld %lld", &pages_total, &pages_resident) != 2) pages_resident = 0;
  std::fclose(f);
  return pages_resident * sysconf(_SC_PAGESIZE);
}

long long huge_page_bytes() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (!f) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "AnonHugePages: %lld kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024;
}

}  // namespace tessera::profile
