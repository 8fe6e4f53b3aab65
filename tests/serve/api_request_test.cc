// The OpenAI request parsers: every accepted field lands where it belongs with OpenAI's
// defaults; wrong types, out-of-range numbers, unknown and unimplemented fields, bad JSON and
// ill-formed UTF-8 are ApiError 400 naming the field.
#include <gtest/gtest.h>

#include <string>

#include "serve/api_request.h"

namespace tessera::serve {
namespace {

// The ApiError a parse throws (status, param, message), or fails the test.
template <typename F>
ApiError error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return ApiError(0, "");
}

void expect_400(const std::string& body, const std::string& param, const std::string& words,
                bool chat = true) {
  const ApiError e = error_of([&] {
    if (chat)
      parse_chat_request(body);
    else
      parse_completion_request(body);
  });
  EXPECT_EQ(e.status, 400) << body;
  EXPECT_EQ(e.param, param) << body << ": " << e.what();
  EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
}

TEST(ApiRequest, ChatFieldsAndDefaults) {
  const GenerationRequest r = parse_chat_request(R"({"model": "m",
      "messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "text", "text": "b"}]}],
      "max_completion_tokens": 12, "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1,
      "stop": "END", "seed": -3, "n": 2, "presence_penalty": 1, "frequency_penalty": -1,
      "logprobs": true, "top_logprobs": 4, "stream": true,
      "stream_options": {"include_usage": true}, "user": "u1", "ignore_eos": true,
      "tools": [], "logit_bias": null})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system") << "developer is the system message";
  EXPECT_EQ(r.messages[1].content, "a\nb");
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_STREQ(r.max_tokens_field, "max_completion_tokens");
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);

  const GenerationRequest d = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(d.max_tokens, -1);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f) << "OpenAI's default";
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
  EXPECT_EQ(d.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(d.sampling.min_p, 0.0f);
  EXPECT_EQ(d.top_logprobs, -1);
  EXPECT_FALSE(d.seed_given);
  const GenerationRequest d2 =
      parse_chat_request(R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_NE(d.sampling.seed, d2.sampling.seed) << "without a seed each request draws its own";
}

// SGLang's router adds its own fields to every request: accepted where they ask for what the
// server does anyway, refused where they ask for more.
TEST(ApiRequest, RouterFields) {
  const GenerationRequest r = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"model":"unknown","no_stop_trim":false,
          "continue_final_message":false,"skip_special_tokens":true,"separate_reasoning":true,
          "stream_reasoning":true,"return_hidden_states":false,"logprobs":false})");
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_FALSE(parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],
                                      "skip_special_tokens":false})")
                   .skip_special_tokens);
  expect_400(R"({"messages":[{"role":"user","content":"x"}],"no_stop_trim":true})", "no_stop_trim",
             "not supported");
  expect_400(R"({"messages":[{"role":"user","content":"x"}],"return_hidden_states":true})",
             "return_hidden_states", "not supported");
}

TEST(ApiRequest, CompletionPrompts) {
  EXPECT_EQ(parse_completion_request(R"({"prompt":"hi"})").prompt, "hi");
  EXPECT_EQ(parse_completion_request(R"({"prompt":["hi"]})").prompt, "hi");
  const GenerationRequest t = parse_completion_request(R"({"prompt":[1,2,3],"logprobs":2})");
  EXPECT_TRUE(t.prompt_is_tokens);
  EXPECT_EQ(t.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(t.top_logprobs, 2);
  EXPECT_EQ(parse_completion_request(R"({"prompt":[[4,5]]})").prompt_tokens,
            (std::vector<int32_t>{4, 5}));
  expect_400(R"({"prompt":["a","b"]})", "prompt", "one request per prompt", false);
  expect_400(R"({"prompt":""})", "prompt", "empty", false);
  expect_400(R"({"prompt":[1,-2]})", "prompt", "token ids", false);
  expect_400(R"({"prompt":"a","echo":true})", "echo", "not supported", false);
  expect_400(R"({"prompt":"a","best_of":3})", "best_of", "not supported", false);
  expect_400(R"({"max_tokens":3})", "prompt", "required", false);
}

TEST(ApiRequest, BadFieldsAreNamed) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  expect_400("{" + msgs + R"(,"temperature":"hot"})", "temperature", "must be a number");
  expect_400("{" + msgs + R"(,"temperature":3})", "temperature", "[0, 2]");
  expect_400("{" + msgs + R"(,"top_p":0})", "top_p", "(0, 1]");
  expect_400("{" + msgs + R"(,"n":0})", "n", "[1, 128]");
  expect_400("{" + msgs + R"(,"n":1.5})", "n", "integer");
  expect_400("{" + msgs + R"(,"max_tokens":0})", "max_tokens", "[1,");
  expect_400("{" + msgs + R"(,"max_tokens":1e300})", "max_tokens", "integer");
  expect_400("{" + msgs + R"(,"max_tokens":5,"max_completion_tokens":6})", "max_completion_tokens",
             "differs");
  expect_400("{" + msgs + R"(,"stream":"yes"})", "stream", "true or false");
  expect_400("{" + msgs + R"(,"stream_options":{"include_usage":true}})", "stream_options",
             "stream");
  expect_400("{" + msgs + R"(,"stop":["a",""]})", "stop", "empty");
  expect_400("{" + msgs + R"(,"stop":7})", "stop", "string");
  expect_400("{" + msgs + R"(,"top_logprobs":2})", "top_logprobs", "logprobs");
  expect_400("{" + msgs + R"(,"tools":[{"type":"function"}]})", "tools", "not supported");
  expect_400("{" + msgs + R"(,"response_format":{"type":"json_object"}})", "response_format",
             "not supported");
  expect_400("{" + msgs + R"(,"temprature":0.2})", "temprature", "unknown field");
  expect_400(R"({"messages":[]})", "messages", "non-empty");
  expect_400(R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].role", "tool");
  expect_400(R"({"messages":[{"role":"user"}]})", "messages[0].content", "required");
  expect_400(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
             "messages[0].content[0].type", "image_url");
  expect_400(R"({"messages":[{"role":"user","content":"x","extra":1}]})", "messages[0].extra",
             "unknown field");
  expect_400(R"({"messages":[{"role":"user","content":"x","name":"bob"}]})", "messages[0].name",
             "not supported");
}

TEST(ApiRequest, BadBodies) {
  for (const std::string& body : {std::string(""), std::string("{"), std::string("[1,2]"),
                                  std::string("{\"messages\": \"\xff\xfe\"}"),
                                  std::string(100, '[') + std::string(100, ']')}) {
    const ApiError e = error_of([&] { parse_chat_request(body); });
    EXPECT_EQ(e.status, 400) << body;
  }
  const ApiError deep = error_of([&] { parse_chat_request(std::string(100000, '[')); });
  EXPECT_NE(std::string(deep.what()).find("deeper"), std::string::npos) << deep.what();
}

TEST(ApiRequest, Embeddings) {
  const EmbeddingRequest a = parse_embedding_request(R"({"input":"hello","model":"m"})");
  EXPECT_EQ(a.texts, std::vector<std::string>{"hello"});
  const EmbeddingRequest b =
      parse_embedding_request(R"({"input":["a","b"],"encoding_format":"base64"})");
  EXPECT_EQ(b.texts.size(), 2u);
  EXPECT_TRUE(b.base64);
  EXPECT_EQ(parse_embedding_request(R"({"input":[1,2]})").token_lists.size(), 1u);
  EXPECT_EQ(parse_embedding_request(R"({"input":[[1],[2,3]]})").token_lists.size(), 2u);
  const ApiError e = error_of([] { parse_embedding_request(R"({"input":"a","dimensions":8})"); });
  EXPECT_EQ(e.param, "dimensions");
  const ApiError f =
      error_of([] { parse_embedding_request(R"({"input":"a","encoding_format":"int8"})"); });
  EXPECT_EQ(f.param, "encoding_format");
  EXPECT_EQ(error_of([] { parse_embedding_request(R"({"input":[]})"); }).param, "input");
}

}  // namespace
}  // namespace tessera::serve
