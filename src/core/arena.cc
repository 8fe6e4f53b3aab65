// Arena allocation (aligned_alloc, zero-filled) and plan bookkeeping.
#include "core/arena.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tessera {

size_t ArenaPlan::reserve(const std::string& name, size_t bytes) {
  const size_t off = total_;
  const size_t rounded = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  regions_.push_back({name, off, bytes});
  total_ += rounded;
  return off;
}

void Arena::Free::operator()(char* p) const {
  std::free(p);
}

Arena::Arena(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  char* p = static_cast<char*>(std::aligned_alloc(kArenaAlign, rounded));
  TS_CHECK(p != nullptr, "[arena] cannot allocate ", bytes, " bytes");
  std::memset(p, 0, rounded);
  data_.reset(p);
}

}  // namespace tessera
