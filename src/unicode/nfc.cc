// Unicode NFC over UTF-8: a quick check that finds the spans NFC may change, and decomposition,
// canonical ordering and composition applied to those spans only.
#include "unicode/nfc.h"

#include <algorithm>
#include <vector>

#include "unicode/nfc_data.h"
#include "unicode/utf8.h"

namespace tessera::unicode {
namespace {

// An invalid UTF-8 byte travels through the algorithm as the code point decode_utf8 gives it
// (kInvalidUtf8Base + byte, outside Unicode): class 0, no decomposition, composes with nothing,
// and encodes back to the byte.

// Hangul syllable arithmetic (Unicode chapter 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Below this every code point is stable (class 0, quick check Yes): Latin-1 and the Latin
// extensions skip the table search.
const uint32_t kFirstUnstable = kNfcUnstableRanges[0].lo;

bool is_stable(uint32_t cp) {
  if (cp < kFirstUnstable || cp >= kInvalidUtf8Base) return true;
  const auto* end = kNfcUnstableRanges + kNfcUnstableRangeCount;
  const auto* it = std::lower_bound(kNfcUnstableRanges, end, cp,
                                    [](const NfcRange& r, uint32_t v) { return r.hi < v; });
  return it == end || it->lo > cp;
}

uint8_t combining_class(uint32_t cp) {
  if (cp < kFirstUnstable || cp >= kInvalidUtf8Base) return 0;
  const auto* end = kCombiningClasses + kCombiningClassCount;
  const auto* it =
      std::lower_bound(kCombiningClasses, end, cp,
                       [](const CombiningClassRange& r, uint32_t v) { return r.hi < v; });
  return it != end && it->lo <= cp ? static_cast<uint8_t>(it->ccc) : 0;
}

struct Mark {
  uint32_t cp;
  uint8_t ccc;
};

// Appends the full canonical decomposition of cp.
void decompose(uint32_t cp, std::vector<Mark>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back({kLBase + s / kNCount, 0});
    out->push_back({kVBase + (s % kNCount) / kTCount, 0});
    if (s % kTCount != 0) out->push_back({kTBase + s % kTCount, 0});
    return;
  }
  if (cp >= 0xC0 && cp < kInvalidUtf8Base) {
    const auto* end = kDecompositions + kDecompositionCount;
    const auto* it = std::lower_bound(kDecompositions, end, cp,
                                      [](const Decomposition& d, uint32_t v) { return d.cp < v; });
    if (it != end && it->cp == cp) {
      decompose(it->first, out);  // depth is bounded by the data (at most 4 steps)
      if (it->second != 0) decompose(it->second, out);
      return;
    }
  }
  out->push_back({cp, combining_class(cp)});
}

// The primary composite of a + b, or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition key{a, b, 0};
  const auto* end = kCompositions + kCompositionCount;
  const auto* it =
      std::lower_bound(kCompositions, end, key, [](const Composition& x, const auto& y) {
        return x.first != y.first ? x.first < y.first : x.second < y.second;
      });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

// NFD of `span` into *marks: canonical decomposition, then canonical ordering.
void decompose_span(std::string_view span, std::vector<Mark>* out) {
  std::vector<Mark>& marks = *out;
  marks.clear();
  for (size_t i = 0; i < span.size();) {
    uint32_t cp;
    i += decode_utf8(span, i, &cp);
    decompose(cp, &marks);
  }
  // Canonical ordering: each run of non-starters sorted stably by class.
  for (size_t i = 0; i < marks.size();) {
    if (marks[i].ccc == 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < marks.size() && marks[j].ccc != 0) ++j;
    if (j - i > 1)
      std::stable_sort(marks.begin() + static_cast<std::ptrdiff_t>(i),
                       marks.begin() + static_cast<std::ptrdiff_t>(j),
                       [](const Mark& a, const Mark& b) { return a.ccc < b.ccc; });
    i = j;
  }
}

// NFC of a span that starts at a normalization boundary and ends just before one.
void normalize_span(std::string_view span, std::string* out) {
  thread_local std::vector<Mark> marks;
  decompose_span(span, &marks);
  // Canonical composition, in place: marks[0, n) is the output so far. A character joins the
  // last starter unless something between them is a starter or has a class >= its own.
  size_t n = 0;
  size_t starter = SIZE_MAX;  // index of the last starter in the output
  uint8_t last_ccc = 0;       // class of the last output character after that starter
  for (size_t i = 0; i < marks.size(); ++i) {
    const Mark m = marks[i];
    const bool adjacent = starter != SIZE_MAX && starter + 1 == n;
    if (starter != SIZE_MAX && (adjacent || (last_ccc != 0 && last_ccc < m.ccc))) {
      if (const uint32_t c = compose(marks[starter].cp, m.cp)) {
        marks[starter].cp = c;
        continue;
      }
    }
    if (m.ccc == 0) starter = n;
    last_ccc = m.ccc;
    marks[n++] = m;
  }
  for (size_t i = 0; i < n; ++i) append_utf8(marks[i].cp, out);
}

bool is_ascii(std::string_view text) {
  for (const char c : text)
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  return true;
}

}  // namespace

void nfd_code_points(std::string_view text, std::vector<uint32_t>* out) {
  thread_local std::vector<Mark> marks;
  decompose_span(text, &marks);
  out->clear();
  for (const Mark& m : marks) out->push_back(m.cp);
}

bool is_nfc_quick(std::string_view text) {
  if (is_ascii(text)) return true;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    i += decode_utf8(text, i, &cp);
    if (!is_stable(cp)) return false;
  }
  return true;
}

std::string_view nfc_normalize(std::string_view text, std::string* buf) {
  if (is_ascii(text)) return text;
  // Copy stable characters through; an unstable one starts a span at the last boundary (the
  // stable character before it, which it may compose with) that runs to the next boundary.
  size_t done = 0;      // text[0, done) is settled (copied to buf once buf is in use)
  size_t boundary = 0;  // start of the last stable character
  bool changed = false;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const int len = decode_utf8(text, i, &cp);
    if (is_stable(cp)) {
      boundary = i;
      i += static_cast<size_t>(len);
      continue;
    }
    size_t end = i + static_cast<size_t>(len);
    while (end < text.size()) {
      const int l = decode_utf8(text, end, &cp);
      if (is_stable(cp)) break;
      end += static_cast<size_t>(l);
    }
    if (!changed) {
      buf->clear();
      changed = true;
    }
    buf->append(text.substr(done, boundary - done));
    normalize_span(text.substr(boundary, end - boundary), buf);
    done = end;
    boundary = end;
    i = end;
  }
  if (!changed) return text;
  buf->append(text.substr(done));
  return *buf;
}

}  // namespace tessera::unicode
