// Arena allocation (alloc_large, zero-filled) and plan bookkeeping.
#include "core/arena.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/large_alloc.h"

namespace tessera {

size_t ArenaPlan::reserve(const std::string& name, size_t bytes) {
  const size_t off = total_;
  const size_t rounded = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  regions_.push_back({name, off, bytes});
  total_ += rounded;
  return off;
}

void Arena::Free::operator()(char* p) const {
  free_large(p);
}

Arena::Arena(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  // Large arenas (the KV cache, parameters, optimizer state) go on huge pages: they are
  // streamed every step.
  char* p = static_cast<char*>(alloc_large(bytes, kArenaAlign, "an arena"));
  // Zero up to the 64-byte boundary too: vector loops may read a region's padded tail.
  std::memset(p, 0, (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign);
  data_.reset(p);
}

}  // namespace tessera
