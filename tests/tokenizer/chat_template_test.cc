// Chat formats: detection from real templates (SmolLM2's from its GGUF), default system prompt
// extraction, and rendering against jinja2 renderings of each family's published template.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "formats/gguf.h"
#include "test_util/expect_error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";

nlohmann::json families() {
  return nlohmann::json::parse(read_text_file(kDir + "chat_golden.json"))["families"];
}

std::vector<tokenizer::ChatMessage> messages(const nlohmann::json& j) {
  std::vector<tokenizer::ChatMessage> out;
  for (const auto& m : j)
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

TEST(ChatTemplate, SmolLM2TemplateFromGguf) {
  const formats::GgufFile f(kDir + "smollm2.gguf");
  const std::string& t = f.get_string("tokenizer.chat_template");
  bool guessed = true;
  EXPECT_EQ(tokenizer::detect_chat_format(t, &guessed), tokenizer::ChatFormat::chatml);
  EXPECT_FALSE(guessed);
  EXPECT_EQ(tokenizer::default_system_prompt(t),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  // The rendered prompt tokenizes with the markers as single special tokens.
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(f);
  const std::string prompt = tokenizer::render_chat(tokenizer::ChatFormat::chatml, {{"user", "Hi"}},
                                                    true, "", tokenizer::default_system_prompt(t));
  const std::vector<int32_t> ids = tok.encode(prompt);
  EXPECT_EQ(ids.front(), 1);                            // <|im_start|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);  // two <|im_end|>
  EXPECT_EQ(tok.decode(ids), prompt);
}

TEST(ChatTemplate, RendersLikeJinja) {
  for (const auto& fam : families()) {
    const std::string name = fam["family"].get<std::string>();
    const std::string tpl = fam["template"].get<std::string>();
    bool guessed = true;
    const tokenizer::ChatFormat f = tokenizer::detect_chat_format(tpl, &guessed);
    EXPECT_EQ(tokenizer::chat_format_name(f), fam["format"].get<std::string>()) << name;
    EXPECT_FALSE(guessed) << name;
    const std::string sys = tokenizer::default_system_prompt(tpl);
    for (const auto& r : fam["renders"]) {
      EXPECT_EQ(
          tokenizer::render_chat(f, messages(r["messages"]), r["add_generation_prompt"].get<bool>(),
                                 fam["bos"].get<std::string>(), sys),
          r["text"].get<std::string>())
          << name << " " << r["messages"].dump();
    }
  }
}

TEST(ChatTemplate, DefaultSystemPrompt) {
  EXPECT_EQ(tokenizer::default_system_prompt(""), "");
  // An expression, not a literal, after the marker.
  EXPECT_EQ(
      tokenizer::default_system_prompt("{{ '<|im_start|>system\\n' + messages[0]['content'] + "
                                       "'<|im_end|>' }}"),
      "");
  // Escapes inside the literal are undone; a later literal occurrence is found.
  EXPECT_EQ(
      tokenizer::default_system_prompt("{{ '<|im_start|>system\\n' + x + '<|im_end|>' }}{{ "
                                       "'<|im_start|>system\\nIt\\'s me.\\nHi<|im_end|>\\n' }}"),
      "It's me.\nHi");
}

TEST(ChatTemplate, DetectionAndGuess) {
  bool guessed = false;
  EXPECT_EQ(tokenizer::detect_chat_format("", &guessed), tokenizer::ChatFormat::chatml);
  EXPECT_TRUE(guessed);
  EXPECT_EQ(tokenizer::detect_chat_format("{{ messages }}", &guessed),
            tokenizer::ChatFormat::chatml);
  EXPECT_TRUE(guessed);
  EXPECT_EQ(tokenizer::detect_chat_format("<|user|>\n{{ x }}</s>", &guessed),
            tokenizer::ChatFormat::zephyr);
  EXPECT_FALSE(guessed);
  EXPECT_EQ(tokenizer::detect_chat_format("<|user|> only"), tokenizer::ChatFormat::chatml);
}

TEST(ChatTemplate, ParseAndErrors) {
  for (const char* n : {"chatml", "llama2", "llama3", "zephyr", "raw"})
    EXPECT_EQ(tokenizer::chat_format_name(tokenizer::parse_chat_format(n)), n);
  test::expect_error([] { tokenizer::parse_chat_format("vicuna"); },
                     "unknown chat format 'vicuna'");
  test::expect_error([] { tokenizer::parse_chat_format("vicuna", "--chat-template"); },
                     "unknown --chat-template 'vicuna'");
  test::expect_error([] { tokenizer::parse_chat_format("vicuna"); }, "vicuna");
  test::expect_error(
      [] {
        tokenizer::render_chat(tokenizer::ChatFormat::llama2, {{"user", "a"}, {"user", "b"}}, true,
                               "<s>", "");
      },
      "alternate");
  test::expect_error(
      [] {
        tokenizer::render_chat(tokenizer::ChatFormat::chatml, {{"", "a"}}, true, "", "");
      },
      "empty role");
  test::expect_error(
      [] {
        tokenizer::render_chat(tokenizer::ChatFormat::zephyr, {{"tool", "a"}}, true, "", "");
      },
      "tool");
}

TEST(ChatTemplate, RawAndStopStrings) {
  EXPECT_EQ(tokenizer::render_chat(tokenizer::ChatFormat::raw,
                                   {{"user", "Once upon"}, {"assistant", " a time"}}, true, "<s>",
                                   "ignored"),
            "Once upon a time");
  EXPECT_EQ(tokenizer::chat_stop_strings(tokenizer::ChatFormat::chatml),
            std::vector<std::string>{"<|im_end|>"});
  EXPECT_EQ(tokenizer::chat_stop_strings(tokenizer::ChatFormat::llama3),
            std::vector<std::string>{"<|eot_id|>"});
  EXPECT_EQ(tokenizer::chat_stop_strings(tokenizer::ChatFormat::llama2),
            std::vector<std::string>{"</s>"});
  EXPECT_EQ(tokenizer::chat_stop_strings(tokenizer::ChatFormat::zephyr),
            std::vector<std::string>{"</s>"});
  EXPECT_TRUE(tokenizer::chat_stop_strings(tokenizer::ChatFormat::raw).empty());
}

}  // namespace
}  // namespace tessera::tokenizer
