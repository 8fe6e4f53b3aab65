// Tests of alloc_large: the alignment asked for (huge-page alignment from 2 MiB up, where huge
// pages are advised), writable memory of the full size, clear errors for absurd requests.
#include "core/large_alloc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace tessera {
namespace {

TEST(LargeAlloc, AlignsAndHoldsTheWholeSize) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, kHugePageBytes - 1, kHugePageBytes,
                       kHugePageBytes + 1, 3 * kHugePageBytes + 12345})
    for (size_t align : {size_t{64}, size_t{4096}}) {
      auto* p = static_cast<uint8_t*>(alloc_large(bytes, align, "a test buffer"));
      ASSERT_NE(p, nullptr);
      const size_t want = bytes >= kHugePageBytes && huge_pages_enabled() ? kHugePageBytes : align;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % want, 0u) << bytes << " bytes";
      std::memset(p, 0xab, bytes);  // every byte is ours (ASan reports an overrun)
      EXPECT_EQ(p[bytes - 1], 0xab);
      free_large(p);
    }
}

TEST(LargeAlloc, AbsurdRequestsAreRefusedNamingTheBuffer) {
  try {
    alloc_large(SIZE_MAX - 10, 64, "the model file x.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.gguf"), std::string::npos) << e.what();
  }
  EXPECT_THROW(alloc_large(100, 48, "a buffer"), Error);  // not a power of two
  EXPECT_THROW(alloc_large(100, 2 * kHugePageBytes, "a buffer"), Error);
}

}  // namespace
}  // namespace tessera
