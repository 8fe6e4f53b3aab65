// Large allocations on transparent huge pages (madvise), with a plain aligned fallback.
#include "core/large_alloc.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tessera {

bool huge_pages_enabled() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool enabled = [] {
    const char* env = std::getenv("TESSERA_HUGE_PAGES");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return enabled;
#else
  return false;
#endif
}

void* alloc_large(size_t bytes, size_t align, const char* what) {
  TS_CHECK(align > 0 && (align & (align - 1)) == 0 && align <= kHugePageBytes, "[alloc] alignment ",
           align, " for ", what, " is not a power of two up to 2 MiB");
  const bool huge = bytes >= kHugePageBytes && huge_pages_enabled();
  if (huge) align = kHugePageBytes;
  // aligned_alloc wants a multiple of the alignment; SIZE_MAX-sized requests fail the check.
  TS_CHECK(bytes <= SIZE_MAX - align, "[alloc] cannot allocate ", bytes, " bytes for ", what);
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  TS_CHECK(p != nullptr, "[alloc] cannot allocate ", bytes, " bytes for ", what);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // A hint: where THP is off ("never") or no huge page is free, the pages stay 4 KiB.
  if (huge) ::madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void free_large(void* p) {
  std::free(p);
}

}  // namespace tessera
