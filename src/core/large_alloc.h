// Allocation of large, long-lived buffers (weights read from a file, the KV cache, training
// state): on transparent huge pages where the kernel offers them.
#pragma once

#include <cstddef>

namespace tessera {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// At least `bytes` bytes aligned to `align` (a power of two, at most kHugePageBytes), not
// initialized; throws naming `what` when memory runs out. A buffer of kHugePageBytes or more is
// aligned and sized to whole huge pages and advised as MADV_HUGEPAGE (Linux), so that its pages
// fault in 2 MiB at a time: a decode step streams every weight once, and on 4 KiB pages each
// page costs a TLB miss (a page walk in the middle of the stream; the 1.1B q4_0 model decoded
// 5-24% faster on two threads on huge pages, docs/PERFORMANCE-LOG.md). TESSERA_HUGE_PAGES=0
// turns the advice off (to measure it). Free with free_large.
void* alloc_large(size_t bytes, size_t align, const char* what);
void free_large(void* p);

// Whether alloc_large advises huge pages (TESSERA_HUGE_PAGES unset or not "0", on Linux).
bool huge_pages_enabled();

}  // namespace tessera
