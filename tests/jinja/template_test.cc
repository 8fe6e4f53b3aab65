// The Jinja renderer against jinja2: every feature case and chat template fixture under
// tests/data/chat_templates/ renders byte for byte as jinja2 rendered it (scripts/jinja_oracle.py
// wrote the expected outputs, the way transformers' apply_chat_template runs jinja2), and fails
// where jinja2 fails, with one line naming the template position. Then the limits that keep
// hostile templates from hanging or crashing, and the API around the renderer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "jinja/template.h"
#include "test_util/expect_error.h"

namespace tessera::jinja {
namespace {

using nlohmann::ordered_json;

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/chat_templates/";

ordered_json load(const std::string& file) {
  return ordered_json::parse(read_text_file(kDir + file));
}

// The oracle's fixed clock: 2024-07-26 10:30:00.
std::tm fixed_clock() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 10;
  tm.tm_min = 30;
  tm.tm_wday = 5;
  tm.tm_yday = 207;
  return tm;
}

// An error message is one line starting "[jinja] <name>:<line>:<col>: ".
void expect_positioned(const std::string& what, const std::string& name) {
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  EXPECT_TRUE(std::regex_search(what, std::regex("^\\[jinja\\] " + name + ":[0-9]+:[0-9]+: ")))
      << what;
}

std::string render(const std::string& src, const ordered_json& context = ordered_json::object(),
                   bool trim_lstrip = true, const std::string& name = "t") {
  Options o;
  o.trim_blocks = o.lstrip_blocks = trim_lstrip;
  o.name = name;
  return Template(src, o).render(from_json(context));
}

// ----- feature cases (features.json) -----

class Feature : public ::testing::TestWithParam<ordered_json> {};

TEST_P(Feature, MatchesJinja2) {
  const ordered_json& c = GetParam();
  const std::string name = c["name"].get<std::string>();
  const std::string src = c["template"].get<std::string>();
  SCOPED_TRACE(src);
  if (c.contains("output")) {
    std::string got;
    try {
      got = render(src, c["context"], c["trim_lstrip"].get<bool>(), name);
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    EXPECT_EQ(got, c["output"].get<std::string>());
  } else {
    try {
      const std::string got = render(src, c["context"], c["trim_lstrip"].get<bool>(), name);
      ADD_FAILURE() << "rendered '" << got << "'; jinja2 failed with " << c["error"];
    } catch (const Error& e) {
      expect_positioned(e.what(), name);
    }
  }
}

std::vector<ordered_json> feature_cases() {
  std::vector<ordered_json> out;
  for (const auto& c : load("features.json")) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Jinja, Feature, ::testing::ValuesIn(feature_cases()),
                         [](const auto& info) {
                           return info.param["name"].template get<std::string>();
                         });

// ----- chat template fixtures (<family>.jinja, <family>.expected) -----

class ChatFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatFixture, MatchesTransformers) {
  const std::string family = GetParam();
  const std::string src = read_text_file(kDir + family + ".jinja");
  const ordered_json expected = load(family + ".expected");
  const ordered_json conversations = load("conversations.json");
  int checked = 0;
  for (const auto& conv : conversations) {
    for (int gen = 0; gen < 2; ++gen) {
      const std::string key = conv["name"].get<std::string>() + "|gen=" + std::to_string(gen);
      SCOPED_TRACE(family + " " + key);
      ASSERT_TRUE(expected.contains(key));
      const ordered_json& want = expected[key];
      ordered_json extra = conv.value("extra", ordered_json::object());
      if (conv.contains("tools")) extra["tools"] = conv["tools"];
      try {
        const std::string got = render_chat_template(src, conv["messages"], "<s>", "</s>", gen == 1,
                                                     extra, fixed_clock, family);
        if (want.contains("output")) {
          EXPECT_EQ(got, want["output"].get<std::string>());
        } else {
          ADD_FAILURE() << "rendered; jinja2 failed with " << want["error"];
        }
      } catch (const Error& e) {
        if (want.contains("output")) {
          ADD_FAILURE() << e.what();
        } else {
          expect_positioned(e.what(), family);
          // raise_exception's message comes through whole.
          const std::string err = want["error"].get<std::string>();
          const std::string prefix = "TemplateError: ";
          if (err.rfind(prefix, 0) == 0) {
            EXPECT_NE(std::string(e.what()).find(err.substr(prefix.size())), std::string::npos)
                << e.what();
          }
        }
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(expected.size()));
}

INSTANTIATE_TEST_SUITE_P(Jinja, ChatFixture,
                         ::testing::Values("chatml", "deepseek", "gemma", "llama31", "mistral",
                                           "qwen25", "zephyr"));

// The published templates of SmolLM2, Qwen2, ChatML, Llama 2, Llama 3 and Zephyr that
// tests/data/tokenizer/chat_golden.json holds with their jinja2 renderings
// (scripts/gen_real_tokenizer_golden.py: trim_blocks and lstrip_blocks on, eos "</s>" where the
// template uses it).
TEST(ChatGolden, PublishedTemplatesRenderLikeJinja2) {
  const ordered_json golden = ordered_json::parse(
      read_text_file(std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/chat_golden.json"));
  int checked = 0;
  for (const auto& fam : golden["families"]) {
    const std::string bos = fam["bos"].get<std::string>();
    const std::string eos = bos == "<s>" ? "</s>" : "";
    for (const auto& r : fam["renders"]) {
      EXPECT_EQ(render_chat_template(fam["template"].get<std::string>(), r["messages"], bos, eos,
                                     r["add_generation_prompt"].get<bool>()),
                r["text"].get<std::string>())
          << fam["family"] << " " << r["messages"].dump();
      ++checked;
    }
  }
  EXPECT_EQ(checked, 48);
}

// ----- errors: where and what -----

TEST(JinjaErrors, NameLineAndColumn) {
  try {
    render("line one\n  {{ 1 + 'a' }}", {}, true, "my.jinja");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[jinja] my.jinja:2:8: unsupported operand type(s) for +: 'int' and 'str'");
  }
  try {
    render("{% for x in y %}\n{% endif %}", {}, true, "loop.jinja");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[jinja] loop.jinja:2:4: ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("'endfor'"), std::string::npos) << e.what();
  }
  test::expect_error([] { render("{{ nope.attr }}"); }, "t:1:8: 'nope' is undefined");
  test::expect_error([] { render("{{ 'a' }}\n{{ 1 $ 2 }}"); }, "t:2:6: unexpected character '$'");
  test::expect_error([] { render("{% if x %}"); }, "expected 'elif' or 'else' or 'endif'");
  test::expect_error([] { render("{{ x | nosuch }}"); }, "no filter named 'nosuch'");
  test::expect_error([] { render("{{ 'abc"); }, "unterminated string literal");
  test::expect_error([] { render("{# open"); }, "missing end of comment tag");
  test::expect_error([] { render("{% break %}"); }, "'break' outside a loop");
}

// jinja2 prints a generator (what select, map and the like return) as its address: refused here
// rather than printed differently. Its |list prints.
TEST(JinjaErrors, PrintingAGeneratorIsRefused) {
  test::expect_error([] { render("{{ [1, 2] | select }}"); }, "cannot print a generator");
  test::expect_error([] { render("{{ [1] | map('string') | string }}"); },
                     "cannot print a generator");
  EXPECT_EQ(render("{{ [1, 2] | select | list }}"), "[1, 2]");
}

TEST(JinjaErrors, RaiseExceptionNamesTemplateAndMessage) {
  const ordered_json msgs = ordered_json::parse(R"([{"role": "system", "content": "x"}])");
  test::expect_error(
      [&] {
        render_chat_template(
            "{% if messages[0].role == 'system' %}{{ raise_exception('no system "
            "role') }}{% endif %}",
            msgs, "", "", false, nullptr, fixed_clock, "gemma.jinja");
      },
      "[jinja] gemma.jinja:1:41: the template raised an exception: no system role");
}

// ----- hostile templates -----

TEST(JinjaLimits, RunawayLoopsStop) {
  Options o;
  o.max_steps = 100000;
  const Template t(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", o);
  test::expect_error([&] { t.render(Value()); }, "more than 100000 steps");
}

TEST(JinjaLimits, RecursionStops) {
  test::expect_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); },
                     "macro calls nested deeper than 100");
}

TEST(JinjaLimits, DeepNestingFailsCleanly) {
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  test::expect_error([&] { render(deep); }, "nested deeper than 200");
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  test::expect_error([&] { render(blocks); }, "nested deeper than 200");
  const std::string list = "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}";
  test::expect_error([&] { render(list); }, "nested deeper than 200");
}

TEST(JinjaLimits, DeeplyNestedValuesFail) {
  test::expect_error(
      [] {
        render(
            "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] "
            "%}{% endfor %}{{ ns.x }}");
      },
      "nested deeper than 1000 levels");
}

TEST(JinjaLimits, HugeValuesFail) {
  test::expect_error([] { render("{{ 'a' * 10000000000 }}"); }, "too large");
  test::expect_error([] { render("{{ 2 ** 64 }}"); }, "integer overflow");
  test::expect_error([] { render("{{ range(1000000) }}"); }, "Range too big");
  Options o;
  o.max_output_bytes = 1000;
  test::expect_error(
      [&] { Template("{% for i in range(1000) %}xx{% endfor %}", o).render(Value()); },
      "output larger than 1000 bytes");
}

// Every prefix of every fixture either renders or fails with one positioned line: no crash, no
// hang on truncated input.
TEST(JinjaLimits, TruncatedTemplatesFailCleanly) {
  const ordered_json msgs = load("conversations.json")[1]["messages"];
  for (const char* family : {"llama31", "qwen25", "deepseek", "mistral"}) {
    const std::string src = read_text_file(kDir + family + ".jinja");
    for (size_t n = 0; n < src.size(); n += 7) {
      try {
        render_chat_template(src.substr(0, n), msgs, "<s>", "</s>", true, nullptr, fixed_clock,
                             "cut");
      } catch (const Error& e) {
        expect_positioned(e.what(), "cut");
      }
    }
  }
}

// ----- API -----

TEST(JinjaApi, StrftimeNowUsesTheClock) {
  const std::string out =
      render_chat_template("{{ strftime_now('%d %b %Y %H:%M') }}", ordered_json::array(), "", "",
                           false, nullptr, fixed_clock);
  EXPECT_EQ(out, "26 Jul 2024 10:30");
}

TEST(JinjaApi, ChatGlobals) {
  const std::string src =
      "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|"
      "{{ documents is none }}|{{ messages|length }}|{{ enable_thinking }}";
  EXPECT_EQ(render_chat_template(src, ordered_json::array(), "<s>", "</s>", true,
                                 ordered_json{{"enable_thinking", false}}),
            "<s>|</s>|True|True|True|0|False");
  // transformers' reasoning aliases: "thinking" first, "reasoning_content" last.
  const ordered_json msgs =
      ordered_json::parse(R"([{"role": "assistant", "content": "c", "reasoning": "r"}])");
  EXPECT_EQ(render_chat_template("{{ messages[0]|tojson }}", msgs, "", "", false),
            R"({"thinking": "r", "role": "assistant", "content": "c", "reasoning": "r", )"
            R"("reasoning_content": "r"})");
  test::expect_error([] { render_chat_template("x", ordered_json::object(), "", "", false); },
                     "messages must be a JSON array");
}

TEST(JinjaApi, JsonConversionKeepsOrder) {
  const ordered_json ordered = ordered_json::parse(R"({"b": 1, "a": [1.5, true, null, "s"]})");
  EXPECT_EQ(to_str(from_json(ordered)), "{'b': 1, 'a': [1.5, True, None, 's']}");
  // nlohmann::json sorts object keys; the conversion keeps the order it is given.
  EXPECT_EQ(to_str(from_json(nlohmann::json::parse(R"({"b": 1, "a": 2})"))), "{'a': 2, 'b': 1}");
}

TEST(JinjaApi, TemplateRendersManyTimes) {
  Options o;
  o.trim_blocks = o.lstrip_blocks = true;
  const Template t("{% for x in xs %}{{ x }}{% endfor %}", o);
  EXPECT_EQ(t.render(from_json(ordered_json::parse(R"({"xs": [1, 2]})"))), "12");
  EXPECT_EQ(t.render(from_json(ordered_json::parse(R"({"xs": "ab"})"))), "ab");
  EXPECT_EQ(t.render(Value()), "");
}

}  // namespace
}  // namespace tessera::jinja
