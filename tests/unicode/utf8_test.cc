// Strict UTF-8: every code point round-trips, invalid bytes decode to code points of their own
// that encode back to the same bytes.
#include <gtest/gtest.h>

#include <string>

#include "core/rng.h"
#include "unicode/utf8.h"

namespace tessera::unicode {
namespace {

TEST(Utf8, EveryScalarValueRoundTrips) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // surrogates are not scalar values
    std::string s;
    append_utf8(cp, &s);
    ASSERT_EQ(s.size(), cp < 0x80 ? 1u : cp < 0x800 ? 2u : cp < 0x10000 ? 3u : 4u) << cp;
    uint32_t back = 0;
    ASSERT_EQ(decode_utf8(s, 0, &back), static_cast<int>(s.size())) << cp;
    ASSERT_EQ(back, cp);
  }
}

TEST(Utf8, InvalidSequencesDecodeByteByByte) {
  // Overlong '/', a surrogate, a truncated sequence, a stray continuation byte, > U+10FFFF.
  for (const std::string bad :
       {"\xC0\xAF", "\xED\xA0\x80", "\xE2\x82", "\x80", "\xF4\x90\x80\x80"}) {
    uint32_t cp = 0;
    EXPECT_EQ(decode_utf8(bad, 0, &cp), 1) << testing::PrintToString(bad);
    EXPECT_EQ(cp, kInvalidUtf8Base + static_cast<uint8_t>(bad[0]));
  }
}

TEST(Utf8, AnyByteStringRoundTrips) {
  Rng rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s(rng.below(24), '\0');
    for (char& ch : s) ch = static_cast<char>(rng.below(256));
    std::string back;
    for (size_t i = 0; i < s.size();) {
      uint32_t cp = 0;
      i += decode_utf8(s, i, &cp);
      append_utf8(cp, &back);
    }
    ASSERT_EQ(back, s) << testing::PrintToString(s);
  }
}

}  // namespace
}  // namespace tessera::unicode
