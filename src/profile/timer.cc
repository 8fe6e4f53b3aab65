// Process memory readings for reports.
#include "profile/timer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

namespace tessera::profile {

long long peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<long long>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

long long current_rss_bytes() {
  long long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (std::fscanf(f, "%lld %lld", &pages_total, &pages_resident) != 2) pages_resident = 0;
  std::fclose(f);
  return pages_resident * sysconf(_SC_PAGESIZE);
}

}  // namespace tessera::profile
