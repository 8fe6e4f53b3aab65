// Code point classes over the generated Unicode tables, and the range lookup every table shares.
#include "unicode/char_class.h"

#include <algorithm>

#include "unicode/tables.h"

namespace tessera::unicode {

bool in_ranges(uint32_t cp, const CodePointRange* r, size_t n) {
  // First range whose hi >= cp; the ranges are sorted and disjoint.
  const auto* end = r + n;
  const auto* it =
      std::lower_bound(r, end, cp, [](const CodePointRange& a, uint32_t v) { return a.hi < v; });
  return it != end && it->lo <= cp;
}

CharClass classify_code_point(uint32_t cp) {
  if (cp < 128) return kAsciiClasses[cp];
  if (in_ranges(cp, kLetterRanges, kLetterRangeCount)) return CharClass::kLetter;
  if (in_ranges(cp, kNumberRanges, kNumberRangeCount)) return CharClass::kNumber;
  if (in_ranges(cp, kWhiteSpaceRanges, kWhiteSpaceRangeCount)) return CharClass::kSpace;
  return CharClass::kOther;
}

}  // namespace tessera::unicode
