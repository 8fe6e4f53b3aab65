// The Jinja lexer, following jinja2's: text up to the next "{{", "{%" or "{#"; whitespace control
// ("-" strips all whitespace on that side, "+" turns lstrip_blocks/trim_blocks off); lstrip_blocks
// removes spaces and tabs before a block or comment tag that starts its line; trim_blocks removes
// the newline after a block or comment tag; raw blocks are text; a single trailing newline of the
// template is dropped (keep_trailing_newline off) and \r\n and \r are read as \n.
#include <cstdint>

#include "core/error.h"
#include "jinja/ast.h"
#include "jinja/py_string.h"
#include "unicode/utf8.h"

namespace tessera::jinja {

std::string where(const std::string& name, Pos pos) {
  return cat(name, ":", pos.line, ":", pos.col);
}

namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= 0x1C && c <= 0x1F);
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexOptions& o, const std::string& name)
      : o_(o), name_(name) {
    // jinja2 splits the source at \r\n, \r and \n and joins with \n, dropping one final empty
    // line unless keep_trailing_newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!o_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t at = find_tag(pos_);
      if (at == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[at + 1];  // '{', '%' or '#'
      const char mod = at + 2 < src_.size() ? src_[at + 2] : '\0';
      std::string text = src_.substr(pos_, at - pos_);
      const size_t text_at = pos_;
      const bool raw = kind == '%' && is_raw_begin(at);
      if (mod == '-') {
        text = rstrip_ws(text);
      } else if (mod != '+' && o_.lstrip_blocks && kind != '{') {
        lstrip_line(&text, line_starting);
      }
      emit_text(text, text_at);
      pos_ = at + 2 + (mod == '-' || mod == '+');
      if (raw) {
        line_starting = lex_raw(at);
      } else if (kind == '#') {
        line_starting = lex_comment(at);
      } else {
        line_starting = lex_tag(at, kind == '%');
      }
    }
    out_.push_back({Token::Kind::eof, "", pos_of(src_.size())});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail_at(size_t at, const std::string& what) {
    fail("[jinja] ", where(name_, pos_of(at)), ": ", what);
  }

  Pos pos_of(size_t at) {
    // Positions are asked for in increasing order, so the line count advances incrementally.
    if (at < line_scan_) line_scan_ = 0, line_ = 1, line_start_ = 0;
    for (; line_scan_ < at && line_scan_ < src_.size(); ++line_scan_)
      if (src_[line_scan_] == '\n') ++line_, line_start_ = line_scan_ + 1;
    return {line_, static_cast<int>(code_point_count(
                       std::string_view(src_).substr(line_start_, at - line_start_))) +
                       1};
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // "{%" [-+] \s* "raw" \s* [-] "%}" at `at`.
  bool is_raw_begin(size_t at) const {
    size_t i = at + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    if (i < src_.size() && src_[i] == '-') ++i;
    return src_.compare(i, 2, "%}") == 0;
  }

  static std::string rstrip_ws(const std::string& s) {
    size_t e = s.size();
    while (e > 0 && is_ws(s[e - 1])) --e;
    return s.substr(0, e);
  }

  // lstrip_blocks: spaces and tabs between the last line start and the tag go, when the text
  // has only those there and the line does start there.
  void lstrip_line(std::string* text, bool line_starting) {
    const size_t nl = text->rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    for (size_t i = l_pos; i < text->size(); ++i)
      if ((*text)[i] != ' ' && (*text)[i] != '\t') return;
    text->resize(l_pos);
  }

  void emit_text(const std::string& text, size_t at) {
    if (!text.empty()) out_.push_back({Token::Kind::text, text, pos_of(at)});
  }

  // After an end marker at `end` (the index just past "%}" / "#}" / "}}"), applies the marker's
  // modifier; returns whether the consumed text ends with a newline (jinja2's line_starting).
  bool after_end(char modifier, bool trims) {
    if (modifier == '-') {
      const size_t start = pos_;
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
      return pos_ > start && src_[pos_ - 1] == '\n';
    }
    if (modifier != '+' && trims && o_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      return true;
    }
    return false;
  }

  bool lex_comment(size_t at) {
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail_at(at, "missing end of comment tag '#}'");
    const char modifier =
        close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : '\0';
    pos_ = close + 2;
    return after_end(modifier, true);
  }

  bool lex_raw(size_t at) {
    // Skip to past "%}" of the raw tag; "-%}" strips the whitespace after it (no trim_blocks).
    const size_t close = src_.find("%}", pos_);
    const char begin_mod = src_[close - 1] == '-' ? '-' : '\0';
    pos_ = close + 2;
    if (begin_mod == '-')
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
    // The content runs to the first "{%" [-+] \s* "endraw" \s* [-+]? "%}".
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t j = i + 2;
      const char mod = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : '\0';
      if (mod) ++j;
      while (j < src_.size() && is_ws(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && is_ws(src_[j])) ++j;
      char end_mod = '\0';
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) end_mod = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, i - pos_);
      const size_t text_at = pos_;
      if (mod == '-')
        text = rstrip_ws(text);
      else if (mod != '+' && o_.lstrip_blocks)
        lstrip_line(&text, false);
      emit_text(text, text_at);
      pos_ = j + 2;
      return after_end(end_mod, true);
    }
    fail_at(at, "missing end of raw directive '{% endraw %}'");
  }

  // The tokens of a {{ }} or {% %} tag; `pos_` is past its opening marker.
  bool lex_tag(size_t at, bool block) {
    out_.push_back({block ? Token::Kind::block_begin : Token::Kind::var_begin, "", pos_of(at)});
    std::string stack;  // open brackets: a closing marker inside them is not the tag's end
    while (true) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
      if (pos_ >= src_.size())
        fail_at(at, block ? "unexpected end of template: missing '%}' for this tag"
                          : "unexpected end of template: missing '}}' for this tag");
      const char c = src_[pos_];
      if (stack.empty()) {
        const char* end = block ? "%}" : "}}";
        const bool mod = (c == '-' || (block && c == '+')) && src_.compare(pos_ + 1, 2, end) == 0;
        if (mod || src_.compare(pos_, 2, end) == 0) {
          out_.push_back({block ? Token::Kind::block_end : Token::Kind::var_end, "", pos_of(pos_)});
          pos_ += mod ? 3 : 2;
          return after_end(mod ? c : '\0', block);
        }
      }
      const size_t start = pos_;
      if (is_name_start(c)) {
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        out_.push_back({Token::Kind::name, src_.substr(start, pos_ - start), pos_of(start)});
      } else if (is_digit(c)) {
        lex_number(start);
      } else if (c == '\'' || c == '"') {
        lex_string(start);
      } else {
        static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op(1, c);
        for (const char* two : kTwo)
          if (src_.compare(pos_, 2, two) == 0) op = two;
        if (op.size() == 1 &&
            std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos)
          fail_at(pos_, cat("unexpected character '", std::string(1, c), "'"));
        if (c == '(' || c == '[' || c == '{') {
          stack += c;
        } else if (c == ')' || c == ']' || c == '}') {
          const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
          if (stack.empty() || stack.back() != want)
            fail_at(pos_, cat("unexpected '", std::string(1, c), "'"));
          stack.pop_back();
        }
        pos_ += op.size();
        out_.push_back({Token::Kind::op, op, pos_of(start)});
      }
    }
  }

  void lex_number(size_t start) {
    auto digits = [&] {
      std::string d;
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || src_[pos_] == '_')) {
        if (src_[pos_] != '_') d += src_[pos_];
        ++pos_;
      }
      return d;
    };
    std::string text = digits();
    bool is_float = false;
    // A float cannot follow a '.' (so `x.0.1` reads as attribute accesses).
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      ++pos_;
      text += "." + digits();
      is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t j = pos_ + 1;
      if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
      if (j < src_.size() && is_digit(src_[j])) {
        text += 'e';
        text += src_.substr(pos_ + 1, j - pos_ - 1);
        pos_ = j;
        text += digits();
        is_float = true;
      }
    }
    Token t{is_float ? Token::Kind::floating : Token::Kind::integer, text, pos_of(start)};
    if (is_float) {
      t.fval = std::strtod(text.c_str(), nullptr);
    } else {
      int64_t v = 0;
      for (char d : text) {
        if (v > (INT64_MAX - (d - '0')) / 10) fail_at(start, "integer literal too large");
        v = v * 10 + (d - '0');
      }
      t.ival = v;
    }
    out_.push_back(std::move(t));
  }

  int hex_digits(size_t at, int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      const char h = at + k < src_.size() ? src_[at + k] : '\0';
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) fail_at(at, "truncated \\x, \\u or \\U escape in string literal");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return static_cast<int>(v);
  }

  // A quoted string with Python's escapes undone (jinja2 decodes with "unicode-escape"; an
  // unknown escape keeps its backslash).
  void lex_string(size_t start) {
    const char q = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail_at(start, "unterminated string literal");
      const char c = src_[pos_];
      if (c == q) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) fail_at(start, "unterminated string literal");
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          unicode::append_utf8(static_cast<uint32_t>(hex_digits(pos_, 2)), &out);
          pos_ += 2;
          break;
        case 'u':
          unicode::append_utf8(static_cast<uint32_t>(hex_digits(pos_, 4)), &out);
          pos_ += 4;
          break;
        case 'U': {
          const int cp = hex_digits(pos_, 8);
          if (cp > 0x10FFFF) fail_at(start, "\\U escape past U+10FFFF in string literal");
          unicode::append_utf8(static_cast<uint32_t>(cp), &out);
          pos_ += 8;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++k)
              v = v * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            unicode::append_utf8(v, &out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    out_.push_back({Token::Kind::string, std::move(out), pos_of(start)});
  }

  const LexOptions& o_;
  const std::string& name_;
  std::string src_;
  size_t pos_ = 0;
  std::vector<Token> out_;
  size_t line_scan_ = 0, line_start_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const LexOptions& options,
                       const std::string& name) {
  return Lexer(source, options, name).run();
}

}  // namespace tessera::jinja
