// GPT-2 pre-tokenization by hand over strict UTF-8, and the byte-level alphabet of GPT-2.
#include "tokenizer/pretokenize.h"

#include <array>

#include "unicode/char_class.h"

namespace tessera::tokenizer {
namespace {

using unicode::CharClass;

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
    int len = unicode::next_char(text, p, &c);
    size_t q = p;
    // " ?X+": a single U+0020 may lead a run of letters, numbers or other symbols.
    if (text[p] == ' ' && p + 1 < n) {
      CharClass c2;
      const int len2 = unicode::next_char(text, p + 1, &c2);
      if (c2 != CharClass::kSpace) q = p + 1, c = c2, len = len2;
    }
    if (c != CharClass::kSpace) {
      q += len;
      while (q < n) {
        CharClass c3;
        const int l3 = unicode::next_char(text, q, &c3);
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
      const int l3 = unicode::next_char(text, q, &c3);
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
