// Pre-tokenizer variants of byte-level BPE models (SmolLM's digit split, the Llama 3, Qwen2 and
// Qwen3.5 patterns), written by hand over the code point classes of unicode/char_class.h.
#include <string>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/pretokenize_split.h"
#include "unicode/char_class.h"
#include "unicode/tables.h"

namespace tessera::tokenizer {
namespace {

using unicode::CharClass;

constexpr std::string_view kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen35Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

bool is_newline(char c) {
  return c == '\r' || c == '\n';
}

// Length of one case-folded letter of a contraction at text[pos] matching lower-case `want`
// (0 if none). Unicode simple case folding also maps U+017F (long s) to 's'.
size_t folded_letter(std::string_view text, size_t pos, char want) {
  if (pos >= text.size()) return 0;
  const char c = text[pos];
  if (c == want || c == want - 'a' + 'A') return 1;
  if (want == 's' && text.substr(pos, 2) == "\xC5\xBF") return 2;
  return 0;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at text[pos] == '\'': the match length, or 0.
size_t contraction_len_folded(std::string_view text, size_t pos) {
  static constexpr std::string_view kForms[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  for (const std::string_view form : kForms) {
    size_t q = pos + 1;
    for (const char want : form) {
      const size_t k = folded_letter(text, q, want);
      if (k == 0) {
        q = 0;
        break;
      }
      q += k;
    }
    if (q != 0) return q - pos;
  }
  return 0;
}

CharClass class_at(std::string_view text, size_t pos, int* len) {
  CharClass c;
  *len = unicode::next_char(text, pos, &c);
  return c;
}

// Qwen3.5's pattern puts \p{M} with the letters: a combining mark (class kOther) reads as
// kLetter there.
CharClass class_at(std::string_view text, size_t pos, int* len, bool marks_are_letters) {
  const CharClass c = class_at(text, pos, len);
  if (!marks_are_letters || c != CharClass::kOther || static_cast<uint8_t>(text[pos]) < 0x80)
    return c;
  uint32_t cp;
  unicode::decode_utf8(text, pos, &cp);
  return unicode::is_mark(cp) ? CharClass::kLetter : c;
}

// End of the run of code points of class `cls` starting at `pos`, at most `max_count` of them.
size_t run_end(std::string_view text, size_t pos, CharClass cls, size_t max_count = SIZE_MAX,
               bool marks_are_letters = false) {
  size_t count = 0;
  while (pos < text.size() && count < max_count) {
    int len;
    if (class_at(text, pos, &len, marks_are_letters) != cls) break;
    pos += len;
    ++count;
  }
  return pos;
}

// The Llama 3 / Qwen2 / Qwen3.5 pattern; alternatives are tried in order at each position, as
// the regex engine does, with each alternative's greedy-then-backtrack result computed directly.
// marks: Qwen3.5's [\p{L}\p{M}] in place of \p{L} (the optional lead [^\r\n\p{L}\p{N}] may
// itself be a mark, which then simply starts the run).
void pretokenize_llama3(std::string_view text, size_t max_digits, bool marks,
                        std::vector<std::string_view>* out) {
  const size_t n = text.size();
  size_t p = 0;
  auto emit = [&](size_t end) {
    out->push_back(text.substr(p, end - p));
    p = end;
  };
  while (p < n) {
    if (text[p] == '\'') {
      if (const size_t k = contraction_len_folded(text, p)) {
        emit(p + k);
        continue;
      }
    }
    int len;
    const CharClass c = class_at(text, p, &len, marks);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c == CharClass::kLetter) {
      emit(run_end(text, p, CharClass::kLetter, SIZE_MAX, marks));
      continue;
    }
    if (c != CharClass::kNumber && !is_newline(text[p]) && p + len < n) {
      int len2;
      if (class_at(text, p + len, &len2, marks) == CharClass::kLetter) {
        emit(run_end(text, p + len, CharClass::kLetter, SIZE_MAX, marks));
        continue;
      }
    }
    // \p{N}{1,3} (llama3) or \p{N} (qwen2)
    if (c == CharClass::kNumber) {
      emit(run_end(text, p, CharClass::kNumber, max_digits));
      continue;
    }
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"
    size_t q = p;
    if (text[p] == ' ' && p + 1 < n) {
      int len2;
      if (class_at(text, p + 1, &len2, marks) == CharClass::kOther) q = p + 1;
    }
    if (q > p || c == CharClass::kOther) {
      q = run_end(text, q, CharClass::kOther, SIZE_MAX, marks);
      while (q < n && is_newline(text[q])) ++q;
      emit(q);
      continue;
    }
    // Whitespace run [p, q). "\s*[\r\n]+" ends after the run's last newline; "\s+(?!\S)" takes
    // the run at the end of text, else all but its last code point; "\s+" takes a lone one.
    size_t last = p, after_newline = 0;
    q = p;
    while (q < n) {
      int l;
      if (class_at(text, q, &l) != CharClass::kSpace) break;
      last = q;
      q += l;
      if (is_newline(text[last])) after_newline = q;
    }
    if (after_newline)
      emit(after_newline);
    else if (q == n || last == p)
      emit(q);
    else
      emit(last);
  }
}

// HF Digits(individual_digits=true) then the GPT-2 pattern on the text between digits.
void pretokenize_smollm(std::string_view text, std::vector<std::string_view>* out) {
  size_t from = 0, p = 0;
  while (p < text.size()) {
    int len;
    if (class_at(text, p, &len) == CharClass::kNumber) {
      pretokenize(text.substr(from, p - from), out);
      out->push_back(text.substr(p, len));
      from = p + len;
    }
    p += len;
  }
  pretokenize(text.substr(from), out);
}

}  // namespace

std::string_view pre_tokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::gpt2:
      return "gpt-2";
    case PreTokenizer::smollm:
      return "smollm";
    case PreTokenizer::llama3:
      return "llama-bpe";
    case PreTokenizer::qwen2:
      return "qwen2";
    case PreTokenizer::qwen35:
      return "qwen35";
    case PreTokenizer::falcon:
      return "falcon";
    case PreTokenizer::deepseek_coder:
      return "deepseek-coder";
    case PreTokenizer::deepseek_llm:
      return "deepseek-llm";
  }
  return "?";
}

PreTokenizer parse_pre_tokenizer(std::string_view name, std::string_view where) {
  // llama.cpp gives mpt GPT-2's pattern, and starcoder, refact and command-r SmolLM's (digits
  // apart, then GPT-2's): the same pre-tokenizers under other names.
  if (name == "gpt2" || name == "gpt-2" || name == "mpt") return PreTokenizer::gpt2;
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "command-r")
    return PreTokenizer::smollm;
  if (name == "llama3" || name == "llama-bpe" || name == "llama-v3") return PreTokenizer::llama3;
  if (name == "qwen2") return PreTokenizer::qwen2;
  if (name == "qwen35") return PreTokenizer::qwen35;
  if (name == "falcon") return PreTokenizer::falcon;
  if (name == "deepseek-coder") return PreTokenizer::deepseek_coder;
  if (name == "deepseek-llm") return PreTokenizer::deepseek_llm;
  fail("[tokenizer] ", where, ": unsupported pre-tokenizer '", name,
       "' (known: gpt2, gpt-2, mpt, smollm, starcoder, refact, command-r, llama3, llama-bpe, "
       "llama-v3, qwen2, qwen35, falcon, deepseek-coder, deepseek-llm)");
}

std::string_view pre_tokenizer_split_regex(PreTokenizer p) {
  if (p == PreTokenizer::llama3) return kLlama3Regex;
  if (p == PreTokenizer::qwen2) return kQwen2Regex;
  if (p == PreTokenizer::qwen35) return kQwen35Regex;
  return {};
}

void pretokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* out) {
  switch (kind) {
    case PreTokenizer::gpt2:
      pretokenize(text, out);
      return;
    case PreTokenizer::smollm:
      pretokenize_smollm(text, out);
      return;
    case PreTokenizer::llama3:
      pretokenize_llama3(text, 3, false, out);
      return;
    case PreTokenizer::qwen2:
      pretokenize_llama3(text, 1, false, out);
      return;
    case PreTokenizer::qwen35:
      pretokenize_llama3(text, 1, true, out);
      return;
    case PreTokenizer::falcon:
    case PreTokenizer::deepseek_coder:
    case PreTokenizer::deepseek_llm:
      pretokenize_sequence(kind, text, out);
      return;
  }
}

}  // namespace tessera::tokenizer
