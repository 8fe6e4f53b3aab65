// apply_tokenizer_config: tokenizer_config.json's special tokens (strings or AddedToken objects)
// and add_bos_token land on the tokenizer; anything it cannot honour fails naming the field.
#include <gtest/gtest.h>

#include <string>

#include "test_util/expect_error.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

Tokenizer tiny() {
  return Tokenizer::train_bpe("hello world hello there, the world says hello", 280,
                              {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
}

TEST(TokenizerConfig, SpecialTokensFromStringsAndObjects) {
  Tokenizer t = tiny();
  const int32_t start = t.token_id("<|im_start|>"), end = t.token_id("<|im_end|>"),
                text = t.token_id("<|endoftext|>");
  ASSERT_GE(start, 0);
  ASSERT_GE(end, 0);
  apply_tokenizer_config(R"({"bos_token": "<|im_start|>",
                             "eos_token": {"content": "<|im_end|>", "lstrip": false},
                             "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                             "add_bos_token": true, "chat_template": "ignored here"})",
                         "tokenizer_config.json", &t);
  const SpecialTokens& s = t.special_tokens();
  EXPECT_EQ(s.bos, start);
  EXPECT_EQ(s.eos, end);
  EXPECT_EQ(s.pad, end);
  EXPECT_EQ(s.unk, text);
  EXPECT_TRUE(s.add_bos);
  // Null or absent fields leave the ids as they were.
  apply_tokenizer_config(R"({"pad_token": null})", "c.json", &t);
  EXPECT_EQ(t.special_tokens().pad, end);
  EXPECT_EQ(t.special_tokens().eos, end);
}

TEST(TokenizerConfig, RefusesWhatItCannotHonour) {
  Tokenizer t = tiny();
  test::expect_error(
      [&] { apply_tokenizer_config(R"({"eos_token": "<|nope|>"})", "cfg.json", &t); }, "cfg.json");
  test::expect_error(
      [&] { apply_tokenizer_config(R"({"eos_token": "<|nope|>"})", "cfg.json", &t); },
      "'eos_token'");
  test::expect_error([&] { apply_tokenizer_config(R"({"bos_token": 3})", "cfg.json", &t); },
                     "'bos_token'");
  test::expect_error(
      [&] { apply_tokenizer_config(R"({"bos_token": {"lstrip": true}})", "cfg.json", &t); },
      "'content'");
  test::expect_error([&] { apply_tokenizer_config(R"({"add_bos_token": 1})", "cfg.json", &t); },
                     "'add_bos_token'");
  test::expect_error([&] { apply_tokenizer_config("[1, 2]", "cfg.json", &t); },
                     "not a JSON object");
  test::expect_error([&] { apply_tokenizer_config(R"({"add_bos_token": true})", "cfg.json", &t); },
                     "no bos token");
}

}  // namespace
}  // namespace tessera::tokenizer
