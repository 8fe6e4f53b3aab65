// Chat prompt formats of the common model families (ChatML, Llama 2, Llama 3, Zephyr): detection
// from the Jinja template a model file carries, rendering of a conversation, and stop strings.
// The formats are rendered by hand (no Jinja interpreter); detect_chat_format picks the format.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer {

enum class ChatFormat { chatml, llama2, llama3, zephyr, raw };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (ChatML, Llama 3, Zephyr take any role)
  std::string content;
};

// Recognizes the template by its markers: <|im_start|> -> chatml, <|start_header_id|> -> llama3,
// [INST] -> llama2, <|user|> with </s> -> zephyr. An empty or unrecognized template gives chatml
// with *guessed set to true (false otherwise).
ChatFormat detect_chat_format(std::string_view jinja_template, bool* guessed = nullptr);
// The default system prompt a ChatML template inserts when the conversation has none: the
// literal text between "<|im_start|>system\n" and "<|im_end|>" (as in SmolLM2's and Qwen2's
// templates); "" when the template has no such literal.
std::string default_system_prompt(std::string_view jinja_template);
// "chatml", "llama2", "llama3", "zephyr", "raw"; throws naming the option as `what` (a command
// line: its flag) on anything else.
ChatFormat parse_chat_format(std::string_view name, std::string_view what = "chat format");
std::string_view chat_format_name(ChatFormat f);

// Renders `msgs` as the family's template does. `bos` is the text of the bos token where the
// format writes it (llama2: before each [INST]; llama3: at the start); chatml, zephyr and raw do
// not use it. `default_system` is inserted as a first system message when msgs has none (skipped
// when empty). add_generation_prompt appends the assistant header (llama2 has none). llama2 and
// zephyr end turns with "</s>". raw: the contents concatenated, nothing else. Throws on an empty
// role, and for llama2 on roles that do not alternate user/assistant after an optional system.
std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& msgs,
                        bool add_generation_prompt, const std::string& bos,
                        const std::string& default_system);

// Texts that end the assistant's turn in each format ("<|im_end|>" for chatml, ...); empty for
// raw. Generation also stops at the tokenizer's end-of-generation tokens.
std::vector<std::string> chat_stop_strings(ChatFormat f);

}  // namespace tessera::tokenizer
