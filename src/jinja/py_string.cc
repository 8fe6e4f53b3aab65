// Python string semantics over UTF-8 bytes for the Jinja renderer.
#include "jinja/py_string.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/value.h"
#include "unicode/char_class.h"
#include "unicode/utf8.h"

namespace tessera::jinja {
namespace {

bool is_ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
char up(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
char low(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}

// Code points of s, each with its byte range.
struct Cp {
  uint32_t cp;
  size_t begin, end;
};
std::vector<Cp> decode(std::string_view s) {
  std::vector<Cp> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const int n = unicode::decode_utf8(s, i, &cp);
    out.push_back({cp, i, i + n});
    i += n;
  }
  return out;
}

}  // namespace

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    out.push_back(i);
    uint32_t cp;
    i += unicode::decode_utf8(s, i, &cp);
  }
  out.push_back(s.size());
  return out;
}

int64_t code_point_count(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_space_code_point(uint32_t cp) {
  // Python's isspace includes the separators \x1c-\x1f beside Unicode White_Space.
  if (cp >= 0x1C && cp <= 0x1F) return true;
  if (cp >= unicode::kInvalidUtf8Base) return false;
  return unicode::classify_code_point(cp) == unicode::CharClass::kSpace;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  const std::vector<Cp> cps = decode(s);
  std::vector<uint32_t> set;
  if (chars)
    for (const Cp& c : decode(*chars)) set.push_back(c.cp);
  auto strip_it = [&](uint32_t cp) {
    if (!chars) return is_space_code_point(cp);
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b].cp)) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1].cp)) --e;
  if (b == e) return "";
  return std::string(s.substr(cps[b].begin, cps[e - 1].end - cps[b].begin));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) value_fail("split: empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, pos);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::vector<Cp> cps = decode(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && is_space_code_point(cps[i].cp)) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      // The rest, with trailing whitespace kept, is the last piece.
      out.emplace_back(s.substr(cps[i].begin));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !is_space_code_point(cps[j].cp)) ++j;
    out.emplace_back(
        s.substr(cps[i].begin, (j < cps.size() ? cps[j].begin : s.size()) - cps[i].begin));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) value_fail("rsplit: empty separator");
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    const std::vector<Cp> cps = decode(s);
    size_t i = cps.size();
    while (true) {
      while (i > 0 && is_space_code_point(cps[i - 1].cp)) --i;
      if (i == 0) break;
      if (static_cast<int64_t>(out.size()) == maxsplit) {
        out.emplace_back(s.substr(0, cps[i - 1].end));
        break;
      }
      size_t j = i;
      while (j > 0 && !is_space_code_point(cps[j - 1].cp)) --j;
      out.emplace_back(s.substr(cps[j].begin, cps[i - 1].end - cps[j].begin));
      i = j;
    }
  }
  return {out.rbegin(), out.rend()};
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    size_t brk = 0;
    const unsigned char c = s[i];
    if (c == '\r') {
      brk = i + 1 < s.size() && s[i + 1] == '\n' ? 2 : 1;
    } else if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E)) {
      brk = 1;
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      brk = 2;
    } else if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xA8 ||
                static_cast<unsigned char>(s[i + 2]) == 0xA9)) {
      brk = 3;
    }
    if (brk) {
      out.emplace_back(s.substr(start, (keepends ? i + brk : i) - start));
      i += brk;
      start = i;
    } else {
      ++i;
    }
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view with,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::vector<size_t> offs = code_point_offsets(s);
    int64_t n = 0;
    for (size_t k = 0; k + 1 <= offs.size(); ++k) {
      if (count < 0 || n < count) {
        out += with;
        ++n;
      }
      if (k + 1 < offs.size()) out += s.substr(offs[k], offs[k + 1] - offs[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out += s.substr(pos, at - pos);
    out += with;
    pos = at + old.size();
    ++n;
  }
  out += s.substr(pos);
  return out;
}

namespace {

// Simple case mappings of ASCII, Latin-1, Greek and Cyrillic letters (what chat text needs);
// other code points keep their case.
uint32_t upper_cp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c == 0xB5) return 0x39C;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

uint32_t lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

std::string map_case(std::string_view s, uint32_t (*f)(uint32_t)) {
  std::string out;
  out.reserve(s.size());
  for (const Cp& c : decode(s)) {
    if (c.cp < 0x80)
      out.push_back(static_cast<char>(f(c.cp)));
    else if (c.cp >= unicode::kInvalidUtf8Base)
      out.push_back(s[c.begin]);
    else
      unicode::append_utf8(f(c.cp), &out);
  }
  return out;
}

}  // namespace

std::string py_upper(std::string_view s) {
  return map_case(s, upper_cp);
}
std::string py_lower(std::string_view s) {
  return map_case(s, lower_cp);
}

std::string py_title(std::string_view s) {
  // A letter after a cased letter is lowered, any other letter raised. Non-ASCII bytes count as
  // letters (they are mostly letters in chat text) but keep their case.
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool non_ascii = static_cast<unsigned char>(c) >= 0x80;
    if (is_ascii_letter(c)) {
      c = prev_cased ? low(c) : up(c);
      prev_cased = true;
    } else if (non_ascii) {
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = py_lower(s);
  if (!out.empty()) out[0] = up(out[0]);
  return out;
}

std::string jinja_title(std::string_view s) {
  // jinja2: re.split(r"([-\s({\[<]+)") and each piece's first character raised, the rest lowered.
  std::string out;
  const std::vector<Cp> cps = decode(s);
  bool word_start = true;
  for (const Cp& c : cps) {
    const bool sep = c.cp == '-' || c.cp == '(' || c.cp == '{' || c.cp == '[' || c.cp == '<' ||
                     is_space_code_point(c.cp);
    std::string piece(s.substr(c.begin, c.end - c.begin));
    if (sep) {
      word_start = true;
    } else {
      piece = word_start ? py_upper(piece) : py_lower(piece);
      word_start = false;
    }
    out += piece;
  }
  return out;
}

std::string py_repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (const Cp& c : decode(s)) {
    if (c.cp == static_cast<uint32_t>(q) || c.cp == '\\') {
      out += '\\';
      out += static_cast<char>(c.cp);
    } else if (c.cp == '\n') {
      out += "\\n";
    } else if (c.cp == '\r') {
      out += "\\r";
    } else if (c.cp == '\t') {
      out += "\\t";
    } else if (c.cp < 0x20 || c.cp == 0x7F || (c.cp >= 0x80 && c.cp < 0xA0)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\x%02x", c.cp);
      out += buf;
    } else if (c.cp >= unicode::kInvalidUtf8Base) {
      // Python strings hold no invalid UTF-8; show the byte the way a surrogate escape would.
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\x%02x", c.cp - unicode::kInvalidUtf8Base);
      out += buf;
    } else {
      out += s.substr(c.begin, c.end - c.begin);
    }
  }
  out += q;
  return out;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does: plain
  // notation for exponents -4..15, scientific (two-digit exponent at least) elsewhere.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + eb;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = ch;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[16];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// One %-conversion of a number with C's printf, which Python's % follows for these types.
std::string printf_number(const std::string& flags, int width, int prec, char conv, double d,
                          int64_t i, bool integer) {
  std::string f = "%" + flags;
  if (width >= 0) f += std::to_string(width);
  if (prec >= 0) f += "." + std::to_string(prec);
  char buf[512];
  if (integer) {
    f += "ll";
    f += conv;
    std::snprintf(buf, sizeof buf, f.c_str(), static_cast<long long>(i));
  } else {
    f += conv;
    std::snprintf(buf, sizeof buf, f.c_str(), d);
  }
  return buf;
}

std::string pad(std::string s, const std::string& flags, int width) {
  const int64_t n = code_point_count(s);
  if (width > n) {
    const std::string fill(static_cast<size_t>(width - n), ' ');
    s = flags.find('-') != std::string::npos ? s + fill : fill + s;
  }
  return s;
}

}  // namespace

std::string percent_format(std::string_view fmt, const Value& args) {
  std::vector<Value> list;
  if (args.is_tuple())
    list = args.items();
  else
    list.push_back(args);
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    ++i;
    if (i >= fmt.size()) value_fail("% format: incomplete format");
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string_view::npos) value_fail("% format: incomplete format key");
      if (!args.is_dict()) value_fail("% format: format requires a mapping");
      const Value* v = args.dict().find(fmt.substr(i + 1, close - i - 1));
      if (!v) value_fail("% format: key '", fmt.substr(i + 1, close - i - 1), "' not found");
      arg = *v;
      have_arg = true;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos)
      flags += fmt[i++];
    int width = -1, prec = -1;
    while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
      width = (width < 0 ? 0 : width) * 10 + (fmt[i++] - '0');
      if (width > 10000) value_fail("% format: width too large");
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = 0;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        prec = prec * 10 + (fmt[i++] - '0');
        if (prec > 400) value_fail("% format: precision too large");
      }
    }
    if (i >= fmt.size()) value_fail("% format: incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!have_arg) {
      if (next >= list.size()) value_fail("% format: not enough arguments for format string");
      arg = list[next++];
    }
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? to_str(arg) : repr(arg);
        if (prec >= 0) {
          const std::vector<size_t> offs = code_point_offsets(s);
          if (static_cast<size_t>(prec) + 1 < offs.size()) s.resize(offs[prec]);
        }
        out += pad(s, flags, width);
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
      case 'u': {
        if (!arg.is_number())
          value_fail("% format: %", conv, " format: a number is required, not ", arg.type_name());
        const int64_t v = arg.is_float() ? static_cast<int64_t>(arg.number()) : arg.integer();
        out +=
            printf_number(flags, width, prec, conv == 'i' || conv == 'u' ? 'd' : conv, 0, v, true);
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!arg.is_number()) value_fail("% format: must be real number, not ", arg.type_name());
        out += printf_number(flags, width, prec < 0 ? 6 : prec, conv, arg.number(), 0, false);
        break;
      case 'c': {
        std::string s;
        if (arg.is_int()) {
          if (arg.integer() < 0 || arg.integer() > 0x10FFFF)
            value_fail("% format: %c arg not in range(0x110000)");
          unicode::append_utf8(static_cast<uint32_t>(arg.integer()), &s);
        } else if (arg.is_string() && code_point_count(arg.str()) == 1)
          s = arg.str();
        else
          value_fail("% format: %c requires int or char");
        out += pad(s, flags, width);
        break;
      }
      default:
        value_fail("% format: unsupported format character '", std::string(1, conv), "'");
    }
  }
  if (!used_mapping && next < list.size() && !(list.size() == 1 && list[0].is_dict()))
    value_fail("% format: not all arguments converted during string formatting");
  return out;
}

std::string brace_format(std::string_view fmt, const std::vector<Value>& args,
                         const std::vector<std::pair<std::string, Value>>& kwargs) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string_view::npos) value_fail("format: single '{' encountered");
      const std::string_view field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string_view::npos)
        value_fail("format: field '{", field, "}' uses a conversion or spec (not supported)");
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_index >= args.size()) value_fail("format: not enough positional arguments");
        v = &args[auto_index++];
      } else if (field[0] >= '0' && field[0] <= '9') {
        size_t k = 0;
        for (char d : field) {
          if (d < '0' || d > '9') value_fail("format: bad field '{", field, "}'");
          k = k * 10 + static_cast<size_t>(d - '0');
          if (k > args.size()) break;
        }
        if (k >= args.size()) value_fail("format: index ", field, " out of range");
        v = &args[k];
      } else {
        for (const auto& [name, val] : kwargs)
          if (name == field) v = &val;
        if (!v) value_fail("format: no argument named '", field, "'");
      }
      out += to_str(*v);
      i = close;
    } else if (c == '}') {
      value_fail("format: single '}' encountered");
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace tessera::jinja
