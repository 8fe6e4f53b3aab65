// Code point classes: the generated tables' classes, the compile-time ASCII table against them,
// and invalid UTF-8 bytes as class other.
#include <gtest/gtest.h>

#include <string>

#include "unicode/char_class.h"
#include "unicode/tables.h"

namespace tessera::unicode {
namespace {

TEST(CharClass, ClassesOfSingleCodePoints) {
  EXPECT_EQ(classify_code_point('a'), CharClass::kLetter);
  EXPECT_EQ(classify_code_point(0x706F), CharClass::kLetter);  // CJK ideograph
  EXPECT_EQ(classify_code_point(0x2167), CharClass::kNumber);  // Roman numeral eight (Nl)
  EXPECT_EQ(classify_code_point(0x00A0), CharClass::kSpace);   // no-break space
  EXPECT_EQ(classify_code_point(0x0085), CharClass::kSpace);   // next line
  EXPECT_EQ(classify_code_point(0x001F), CharClass::kOther);   // not White_Space
  EXPECT_EQ(classify_code_point(0x1F30A), CharClass::kOther);  // emoji
  EXPECT_EQ(classify_code_point(0x0301), CharClass::kOther);   // combining mark (Mn)
  EXPECT_EQ(classify_code_point(kInvalidUtf8Base + 0xFF), CharClass::kOther);
}

TEST(CharClass, AsciiTableMatchesTheUnicodeTables) {
  // kAsciiClasses is written by hand so that next_char's common case is a constant; the
  // generated tables are the source of truth.
  for (uint32_t c = 0; c < 128; ++c) {
    const CharClass want = in_ranges(c, kLetterRanges, kLetterRangeCount)   ? CharClass::kLetter
                           : in_ranges(c, kNumberRanges, kNumberRangeCount) ? CharClass::kNumber
                           : in_ranges(c, kWhiteSpaceRanges, kWhiteSpaceRangeCount)
                               ? CharClass::kSpace
                               : CharClass::kOther;
    EXPECT_EQ(kAsciiClasses[c], want) << "code point " << c;
  }
}

TEST(CharClass, InvalidUtf8BytesAreOther) {
  CharClass c;
  // Overlong '/', a surrogate, a truncated sequence, a stray continuation byte, and > U+10FFFF:
  // each invalid byte is one code point of class other.
  for (const std::string bad :
       {"\xC0\xAF", "\xED\xA0\x80", "\xE2\x82", "\x80", "\xF4\x90\x80\x80"}) {
    EXPECT_EQ(next_char(bad, 0, &c), 1) << testing::PrintToString(bad);
    EXPECT_EQ(c, CharClass::kOther);
  }
  EXPECT_EQ(next_char("\xE2\x82\xAC", 0, &c), 3);  // the euro sign is valid
  EXPECT_EQ(c, CharClass::kOther);                 // a symbol (Sc)
  EXPECT_EQ(next_char("\xE3\x80\x80", 0, &c), 3);  // U+3000 ideographic space
  EXPECT_EQ(c, CharClass::kSpace);
}

}  // namespace
}  // namespace tessera::unicode
