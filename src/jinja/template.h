// A Jinja renderer for the chat templates models ship (tokenizer_config.json's chat_template,
// GGUF's tokenizer.chat_template, chat_template.jinja): the subset of Jinja2 those templates use,
// rendering byte for byte as transformers' apply_chat_template does with jinja2
// (ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on, loop controls, its tojson,
// raise_exception and strftime_now). Every parse or render failure is one tessera::Error line
// naming "<template name>:<line>:<column>" and what was wrong.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "jinja/value.h"

namespace tessera::jinja {

struct Options {
  bool trim_blocks = false;    // drop the newline after a block or comment tag
  bool lstrip_blocks = false;  // drop spaces and tabs before a block or comment tag on its line
  bool keep_trailing_newline = false;
  std::string name = "template";  // names the template in error messages
  // Limits that turn hostile templates into errors: blocks and expressions nested, statements
  // run plus loop iterations plus calls, macro recursion, output size.
  int max_nesting = 200;
  int64_t max_steps = 10'000'000;
  int max_call_depth = 100;
  size_t max_output_bytes = size_t{1} << 28;
};

class Template {
 public:
  // Lexes and parses `source`; throws on a syntax error and on an unknown filter or test name
  // (jinja2 reports those at compile time too).
  explicit Template(std::string source, Options options = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the names of `context` (a dict) as globals, beside range, dict and namespace.
  std::string render(const Value& context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The local time strftime_now formats; tests inject a fixed one.
using Clock = std::function<std::tm()>;
std::tm local_now();

// The globals transformers gives a chat template: messages, tools and documents (None when not
// given), bos_token, eos_token, add_generation_prompt, raise_exception(msg) (fails naming the
// template and msg), strftime_now(fmt) (the clock's local time). `extra` (a JSON object or null)
// adds or replaces globals (tools, documents, enable_thinking, ...). Messages get transformers'
// reasoning aliases: a message with reasoning_content, thinking or reasoning gets the first of
// them as "thinking" (first key) and "reasoning_content" (last key).
std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& messages,
                                 const std::string& bos_token, const std::string& eos_token,
                                 bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra = nullptr,
                                 const Clock& clock = local_now,
                                 const std::string& name = "chat_template");

}  // namespace tessera::jinja
