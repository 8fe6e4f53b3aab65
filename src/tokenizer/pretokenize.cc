// GPT-2 pre-tokenization by hand over strict UTF-8, and the byte-level alphabet of GPT-2.
#include "tokenizer/pretokenize.h"

#include <algorithm>
#include <array>

#include "tokenizer/unicode_tables.h"

namespace tessera::tokenizer {

bool unicode::in_ranges(uint32_t cp, const CodePointRange* r, size_t n) {
  // First range whose hi >= cp; the ranges are sorted and disjoint.
  const auto* end = r + n;
  const auto* it =
      std::lower_bound(r, end, cp, [](const CodePointRange& a, uint32_t v) { return a.hi < v; });
  return it != end && it->lo <= cp;
}

namespace {
using unicode::in_ranges;

// ASCII is most of the input, so its classes come from a table built once.
std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> t{};
  for (uint32_t c = 0; c < 128; ++c) {
    t[c] = in_ranges(c, unicode::kWhiteSpaceRanges, unicode::kWhiteSpaceRangeCount)
               ? CharClass::kSpace
           : in_ranges(c, unicode::kLetterRanges, unicode::kLetterRangeCount) ? CharClass::kLetter
           : in_ranges(c, unicode::kNumberRanges, unicode::kNumberRangeCount) ? CharClass::kNumber
                                                                              : CharClass::kOther;
  }
  return t;
}
const std::array<CharClass, 128> kAsciiClasses = make_ascii_classes();

bool is_cont(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd; case-sensitive, as in GPT-2's pattern)
// starting at text[pos] == '\'', or 0.
size_t contraction_len(std::string_view text, size_t pos) {
  if (pos + 1 >= text.size()) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

CharClass classify_code_point(uint32_t cp) {
  if (cp < 128) return kAsciiClasses[cp];
  if (in_ranges(cp, unicode::kLetterRanges, unicode::kLetterRangeCount)) return CharClass::kLetter;
  if (in_ranges(cp, unicode::kNumberRanges, unicode::kNumberRangeCount)) return CharClass::kNumber;
  if (in_ranges(cp, unicode::kWhiteSpaceRanges, unicode::kWhiteSpaceRangeCount))
    return CharClass::kSpace;
  return CharClass::kOther;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp >= kInvalidUtf8Base) {
    out->push_back(static_cast<char>(cp - kInvalidUtf8Base));
  } else if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int decode_utf8(std::string_view text, size_t pos, uint32_t* cp) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = s[pos];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (pos + 1 < n && is_cont(s[pos + 1])) {
      *cp = ((b0 & 0x1Fu) << 6) | (s[pos + 1] & 0x3Fu);
      return 2;
    }
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (pos + 2 < n && is_cont(s[pos + 1]) && is_cont(s[pos + 2])) {
      const uint32_t c = ((b0 & 0x0Fu) << 12) | ((s[pos + 1] & 0x3Fu) << 6) | (s[pos + 2] & 0x3Fu);
      // Rejects overlong forms (< U+0800) and UTF-16 surrogates.
      if (c >= 0x800 && (c < 0xD800 || c > 0xDFFF)) {
        *cp = c;
        return 3;
      }
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (pos + 3 < n && is_cont(s[pos + 1]) && is_cont(s[pos + 2]) && is_cont(s[pos + 3])) {
      const uint32_t c = ((b0 & 0x07u) << 18) | ((s[pos + 1] & 0x3Fu) << 12) |
                         ((s[pos + 2] & 0x3Fu) << 6) | (s[pos + 3] & 0x3Fu);
      if (c >= 0x10000 && c <= 0x10FFFF) {
        *cp = c;
        return 4;
      }
    }
  }
  *cp = kInvalidUtf8Base + b0;
  return 1;
}

int next_char(std::string_view text, size_t pos, CharClass* cls) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {  // the common case, without the call
    *cls = kAsciiClasses[b0];
    return 1;
  }
  uint32_t cp;
  const int len = decode_utf8(text, pos, &cp);
  *cls = cp >= kInvalidUtf8Base ? CharClass::kOther : classify_code_point(cp);
  return len;
}

void pretokenize(std::string_view text, std::vector<std::string_view>* out) {
  const size_t n = text.size();
  size_t p = 0;
  CharClass c;
  while (p < n) {
    const size_t start = p;
    if (text[p] == '\'') {
      if (const size_t k = contraction_len(text, p)) {
        out->push_back(text.substr(p, k));
        p += k;
        continue;
      }
    }
    int len = next_char(text, p, &c);
    size_t q = p;
    // " ?X+": a single U+0020 may lead a run of letters, numbers or other symbols.
    if (text[p] == ' ' && p + 1 < n) {
      CharClass c2;
      const int len2 = next_char(text, p + 1, &c2);
      if (c2 != CharClass::kSpace) q = p + 1, c = c2, len = len2;
    }
    if (c != CharClass::kSpace) {
      q += len;
      while (q < n) {
        CharClass c3;
        const int l3 = next_char(text, q, &c3);
        if (c3 != c) break;
        q += l3;
      }
      out->push_back(text.substr(start, q - start));
      p = q;
      continue;
    }
    // Whitespace run [p, q). "\s+(?!\S)" takes it whole at the end of text, else backtracks one
    // code point so the last one can lead the next word; a run of one falls to "\s+".
    size_t last = p;
    q = p + len;
    while (q < n) {
      CharClass c3;
      const int l3 = next_char(text, q, &c3);
      if (c3 != CharClass::kSpace) break;
      last = q;
      q += l3;
    }
    const size_t end = (q == n || last == p) ? q : last;
    out->push_back(text.substr(p, end - p));
    p = end;
  }
}

uint32_t byte_to_code_point(uint8_t b) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
      t[i] = printable ? static_cast<uint32_t>(i) : next++;
    }
    return t;
  }();
  return table[b];
}

int code_point_to_byte(uint32_t cp) {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_code_point(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

std::string bytes_to_vocab_string(std::string_view bytes) {
  std::string s;
  s.reserve(bytes.size() * 2);
  for (const char ch : bytes) {
    const uint32_t cp = byte_to_code_point(static_cast<uint8_t>(ch));
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {  // every mapped code point is below U+0800: two UTF-8 bytes
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return s;
}

bool vocab_string_to_bytes(std::string_view s, std::string* bytes) {
  bytes->clear();
  const auto* u = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    if (u[i] < 0x80) {
      cp = u[i];
      i += 1;
    } else if (u[i] >= 0xC2 && u[i] <= 0xDF && i + 1 < s.size() && is_cont(u[i + 1])) {
      cp = ((u[i] & 0x1Fu) << 6) | (u[i + 1] & 0x3Fu);
      i += 2;
    } else {
      return false;  // three- and four-byte forms are all outside the alphabet
    }
    const int b = code_point_to_byte(cp);
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace tessera::tokenizer
