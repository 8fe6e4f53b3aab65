// Strict UTF-8 decoding and encoding, invalid bytes kept as code points of their own.
#include "unicode/utf8.h"

namespace tessera::unicode {
namespace {

bool is_cont(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

}  // namespace

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

}  // namespace tessera::unicode
