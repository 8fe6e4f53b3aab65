// Chat formats rendered by hand, matching what each family's Jinja template produces (checked
// against jinja2 renderings in tests/data/tokenizer/chat_golden.json).
#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "unicode/char_class.h"

namespace tessera::tokenizer {
namespace {

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// Python's str.strip() on Unicode whitespace (Jinja's trim and .strip()).
std::string strip(std::string_view s) {
  size_t begin = s.size(), end = 0;
  for (size_t i = 0; i < s.size();) {
    unicode::CharClass c;
    const int len = unicode::next_char(s, i, &c);
    if (c != unicode::CharClass::kSpace) {
      if (begin == s.size()) begin = i;
      end = i + len;
    }
    i += len;
  }
  return begin < end ? std::string(s.substr(begin, end - begin)) : std::string();
}

// The rest of a quoted Jinja literal from `pos` up to `stop`, with escapes undone; false when the
// literal ends (an unescaped quote) before `stop`.
bool literal_until(std::string_view t, size_t pos, std::string_view stop, std::string* out) {
  out->clear();
  while (pos < t.size()) {
    if (t.substr(pos, stop.size()) == stop) return true;
    const char c = t[pos];
    if (c == '\'' || c == '"') return false;
    if (c == '\\' && pos + 1 < t.size()) {
      const char e = t[pos + 1];
      out->push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
      pos += 2;
      continue;
    }
    out->push_back(c);
    ++pos;
  }
  return false;
}

std::vector<ChatMessage> with_default_system(const std::vector<ChatMessage>& msgs,
                                             const std::string& default_system) {
  std::vector<ChatMessage> all;
  if (!msgs.empty() && msgs[0].role != "system" && !default_system.empty())
    all.push_back({"system", default_system});
  all.insert(all.end(), msgs.begin(), msgs.end());
  return all;
}

std::string render_llama2(const std::vector<ChatMessage>& msgs, const std::string& bos) {
  size_t first = 0;
  std::string system;
  bool has_system = false;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    has_system = true;
    first = 1;
  }
  std::string s;
  for (size_t k = first; k < msgs.size(); ++k) {
    const size_t i = k - first;
    const std::string& role = msgs[k].role;
    const bool want_user = i % 2 == 0;
    TS_CHECK(role == (want_user ? "user" : "assistant"), "[chat] render_chat: llama2 message ", k,
             " has role '", role, "', expected '", want_user ? "user" : "assistant",
             "' (roles alternate user/assistant after an optional first system message)");
    std::string content = msgs[k].content;
    if (i == 0 && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (want_user)
      s += bos + "[INST] " + strip(content) + " [/INST]";
    else
      s += " " + strip(content) + " </s>";
  }
  return s;
}

}  // namespace

ChatFormat detect_chat_format(std::string_view t, bool* guessed) {
  if (guessed) *guessed = false;
  if (contains(t, "<|im_start|>")) return ChatFormat::chatml;
  if (contains(t, "<|start_header_id|>")) return ChatFormat::llama3;
  if (contains(t, "[INST]")) return ChatFormat::llama2;
  if (contains(t, "<|user|>") && (contains(t, "</s>") || contains(t, "eos_token")))
    return ChatFormat::zephyr;
  if (guessed) *guessed = true;
  return ChatFormat::chatml;
}

std::string default_system_prompt(std::string_view t) {
  static constexpr std::string_view kMarker = "<|im_start|>system";
  std::string text;
  for (size_t at = t.find(kMarker); at != std::string_view::npos; at = t.find(kMarker, at + 1)) {
    size_t pos = at + kMarker.size();
    if (t.substr(pos, 1) == "\n")
      pos += 1;
    else if (t.substr(pos, 2) == "\\n")
      pos += 2;
    else
      continue;
    if (literal_until(t, pos, "<|im_end|>", &text) && !text.empty()) return text;
  }
  return {};
}

ChatFormat parse_chat_format(std::string_view name, std::string_view what) {
  for (const ChatFormat f : {ChatFormat::chatml, ChatFormat::llama2, ChatFormat::llama3,
                             ChatFormat::zephyr, ChatFormat::raw})
    if (name == chat_format_name(f)) return f;
  fail("unknown ", what, " '", name, "' (expected chatml, llama2, llama3, zephyr or raw)");
}

std::string_view chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::chatml:
      return "chatml";
    case ChatFormat::llama2:
      return "llama2";
    case ChatFormat::llama3:
      return "llama3";
    case ChatFormat::zephyr:
      return "zephyr";
    case ChatFormat::raw:
      return "raw";
  }
  return "?";
}

std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& input,
                        bool add_generation_prompt, const std::string& bos,
                        const std::string& default_system) {
  for (size_t k = 0; k < input.size(); ++k)
    TS_CHECK(!input[k].role.empty(), "[chat] render_chat: message ", k, " has an empty role");
  const std::vector<ChatMessage> msgs = with_default_system(input, default_system);
  std::string s;
  switch (f) {
    case ChatFormat::chatml:
      for (const ChatMessage& m : msgs)
        s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) s += "<|im_start|>assistant\n";
      break;
    case ChatFormat::llama2:
      s = render_llama2(msgs, bos);
      break;
    case ChatFormat::llama3:
      if (!msgs.empty()) s += bos;
      for (const ChatMessage& m : msgs)
        s += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + strip(m.content) +
             "<|eot_id|>";
      if (add_generation_prompt) s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::zephyr:
      for (size_t k = 0; k < msgs.size(); ++k) {
        const std::string& role = msgs[k].role;
        TS_CHECK(role == "system" || role == "user" || role == "assistant",
                 "[chat] render_chat: zephyr message ", k, " has role '", role,
                 "' (only system, user, assistant)");
        s += "<|" + role + "|>\n" + msgs[k].content + "</s>\n";
      }
      if (add_generation_prompt && !msgs.empty()) s += "<|assistant|>\n";
      break;
    case ChatFormat::raw:
      for (const ChatMessage& m : input) s += m.content;
      break;
  }
  return s;
}

std::vector<std::string> chat_stop_strings(ChatFormat f) {
  switch (f) {
    case ChatFormat::chatml:
      return {"<|im_end|>"};
    case ChatFormat::llama2:
      return {"</s>"};
    case ChatFormat::llama3:
      return {"<|eot_id|>"};
    case ChatFormat::zephyr:
      return {"</s>"};
    case ChatFormat::raw:
      return {};
  }
  return {};
}

}  // namespace tessera::tokenizer
