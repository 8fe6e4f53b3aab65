// Tables for Unicode NFC (generated into unicode_nfc_data.cc by scripts/gen_unicode_nfc.py); all
// sorted by their first field for binary search. Hangul syllables are in none of them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::model::unicode {

struct CombiningClassRange {
  uint32_t lo, hi;  // inclusive; every code point in it has canonical combining class `ccc`
  uint32_t ccc;
};

// One canonical decomposition step: cp -> first (+ second, 0 for a singleton). Applying it
// recursively gives the full canonical decomposition.
struct Decomposition {
  uint32_t cp, first, second;
};

// A primary composite: first + second -> composite (composition exclusions are left out).
// Sorted by (first, second).
struct Composition {
  uint32_t first, second, composite;
};

struct NfcRange {
  uint32_t lo, hi;  // inclusive
};

extern const char kNfcUnicodeVersion[];
extern const CombiningClassRange kCombiningClasses[];  // nonzero classes only
extern const size_t kCombiningClassCount;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionCount;
extern const Composition kCompositions[];
extern const size_t kCompositionCount;
// Code points that are not "ccc 0 and NFC_Quick_Check Yes": the ones NFC may change or that may
// combine with what precedes them. Every other code point starts a normalization boundary.
extern const NfcRange kNfcUnstableRanges[];
extern const size_t kNfcUnstableRangeCount;

}  // namespace tessera::model::unicode
