// cli::Args against a flag table: values, letters, defaults, strictness, lists, and the help text
// printed from the same table (each shared fragment's flags and defaults appear in it).
#include <gtest/gtest.h>

#include "test_util/expect_error.h"

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "apps/cli/train_flags.h"
#include "core/error.h"

namespace tessera::cli {
namespace {

using tessera::test::expect_error;

const Flags kTable = {
    Flag::text("--model", "m.gguf", "the model", "PATH"),
    Flag::integer("--tokens", 128, 0, 1000, "tokens"),
    Flag::number("--temperature", 0.8f, 0, 100, "temperature"),
    Flag::toggle("--json", "JSON"),
    Flag::int_list("--batch", "1", 1, 4096, "batch sizes"),
    Flag::text_list("--specials", "<|a|>", "specials").allow_empty_list(),
    Flag::text_list("--names", "x", "names"),
    Flag::choice("--device", "cpu", {"cpu", "cuda"}, "where"),
};

TEST(FlagTable, DefaultsValuesAndLetters) {
  const Args d(kTable, {});
  EXPECT_EQ(d.str("--model"), "m.gguf");
  EXPECT_EQ(d.i64("--tokens"), 128);
  EXPECT_EQ(static_cast<float>(d.f64("--temperature")), 0.8f);
  EXPECT_FALSE(d.on("--json"));
  EXPECT_FALSE(d.given("--tokens"));
  EXPECT_EQ(d.ints("--batch"), std::vector<int64_t>{1});
  EXPECT_EQ(d.strs("--specials"), std::vector<std::string>{"<|a|>"});
  EXPECT_EQ(d.str("--device"), "cpu");

  const Args a(kTable, {"-m", "x.gguf", "-n", "7", "--temperature=0", "--json", "--batch", "1,4,16",
                        "--specials", "", "--names=a,b", "--device", "cuda"});
  EXPECT_EQ(a.str("--model"), "x.gguf");
  EXPECT_EQ(a.i64("--tokens"), 7);
  EXPECT_TRUE(a.given("--tokens"));
  EXPECT_EQ(a.f64("--temperature"), 0.0);
  EXPECT_TRUE(a.on("--json"));
  EXPECT_EQ(a.ints("--batch"), (std::vector<int64_t>{1, 4, 16}));
  EXPECT_TRUE(a.strs("--specials").empty());  // '' means none for this flag
  EXPECT_EQ(a.strs("--names"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a.str("--device"), "cuda");
}

TEST(FlagTable, RefusesNamingTheArgument) {
  expect_error([] { Args(kTable, {"--bogus", "1"}); }, "unknown flag --bogus");
  expect_error([] { Args(kTable, {"-k", "40"}); }, "unknown flag -k");
  expect_error([] { Args(kTable, {"stray"}); }, "unexpected argument 'stray'");
  expect_error([] { Args(kTable, {"--tokens", "many"}); }, "--tokens");
  expect_error([] { Args(kTable, {"--tokens", "1001"}); }, "--tokens");
  expect_error([] { Args(kTable, {"--tokens"}); }, "flag --tokens needs a value");
  expect_error([] { Args(kTable, {"--json=1"}); }, "flag --json takes no value");
  expect_error([] { Args(kTable, {"--batch", ""}); }, "--batch");
  expect_error([] { Args(kTable, {"--batch", "1,,4"}); }, "--batch");
  expect_error([] { Args(kTable, {"--batch", "1,x"}); }, "--batch");
  expect_error([] { Args(kTable, {"--batch", "1,"}); }, "--batch");
  expect_error([] { Args(kTable, {"--batch", "0"}); }, "--batch");
  expect_error([] { Args(kTable, {"--names", ""}); }, "--names");
  expect_error([] { Args(kTable, {"--names", "a,,b"}); }, "--names");
  expect_error(
      [] {
        Args(kTable, {"--device", "tpu"});
      },
      "flag --device must be one of cpu, cuda; got 'tpu'");
  expect_error([] { Args(kTable, {"--device", ""}); }, "--device");
  // An accessor for a flag the table lacks is the command's bug, said as such.
  expect_error([] { Args(kTable, {}).i64("--model"); }, "internal");
}

TEST(FlagTable, PositionalsAndRequiredFlags) {
  const Flags t = {Flag::text("--type", "", "type").required()};
  const std::vector<Positional> io = {{"IN", "input"}, {"OUT", "output"}};
  const Args a(t, {"a", "--type", "q8_0", "b"}, io);
  EXPECT_EQ(a.positional(), (std::vector<std::string>{"a", "b"}));
  expect_error([&] { Args(t, {"a", "--type", "q8_0"}, io); }, "missing argument OUT");
  expect_error([&] { Args(t, {"a", "b", "c", "--type", "x"}, io); }, "unexpected argument 'c'");
  expect_error([&] { Args(t, {"a", "b"}, io); }, "missing required flag --type");
  expect_error([&] { Args(t, {"a", "b", "--type", ""}, io); }, "missing required flag --type");
}

TEST(FlagTable, JoinReplacesBySameName) {
  const Flags j = join({engine_flags(), {Flag::integer("--ctx", 512, 2, 1 << 24, "window")}});
  EXPECT_EQ(j.size(), engine_flags().size());
  EXPECT_EQ(Args(j, {}).i64("--ctx"), 512);
  expect_error([&] { Args(j, {"--ctx", "1"}); }, "--ctx");
}

TEST(FlagTable, HelpListsEveryFlagWithItsDefault) {
  for (const Flags& table : {engine_flags(), sampling_flags(), train_flags(), kTable}) {
    const Command c{"cmd", "one line", table, {{"IN", "input"}}, nullptr, {}};
    const std::string help = help_text(c, "tessera cmd");
    EXPECT_EQ(help.rfind("usage: tessera cmd IN [flags]\none line\n", 0), 0u) << help;
    for (const Flag& f : table) {
      EXPECT_NE(help.find(f.name), std::string::npos) << f.name << "\n" << help;
      if (!f.alias.empty()) {
        EXPECT_NE(help.find(f.alias + ", " + f.name), std::string::npos) << f.name;
      }
      if (!f.def.empty() && f.kind != FlagKind::toggle) {
        EXPECT_NE(help.find("(default: " + f.def + ")"), std::string::npos) << f.name;
      }
      EXPECT_NE(help.find(f.help), std::string::npos) << f.name;
    }
    EXPECT_NE(help.find("-h, --help"), std::string::npos);
    for (const Flag& f : table)  // a choice lists its values as the value's name
      if (f.kind == FlagKind::choice) {
        const size_t at = help.find(f.name + " " + f.metavar);
        ASSERT_NE(at, std::string::npos) << f.name;
        const std::string line = help.substr(at, help.find('\n', at) - at);
        for (const std::string& c : f.choices) EXPECT_NE(line.find(c), std::string::npos) << line;
      }
    for (size_t from = 0, nl; (nl = help.find('\n', from)) != std::string::npos; from = nl + 1)
      EXPECT_LE(nl - from, 100u) << help.substr(from, nl - from);
  }
}

TEST(FlagTable, SharedDefaultsMatchTheLibrary) {
  // Sampling defaults come from infer::SamplingParams; parsed back they are the same values.
  const infer::SamplingParams p = parse_sampling_flags(Args(sampling_flags(), {}));
  const infer::SamplingParams d;
  EXPECT_EQ(p.temperature, d.temperature);
  EXPECT_EQ(p.top_k, d.top_k);
  EXPECT_EQ(p.top_p, d.top_p);
  EXPECT_EQ(p.min_p, d.min_p);
  EXPECT_EQ(p.repetition_penalty, d.repetition_penalty);
  EXPECT_EQ(p.penalty_last_n, d.penalty_last_n);
  EXPECT_EQ(p.seed, d.seed);
  const EngineFlags e = parse_engine_flags(Args(engine_flags(), {}));
  EXPECT_EQ(e.model_path, kDefaultModel);
  EXPECT_EQ(e.threads, 0);
  EXPECT_FALSE(e.cuda);
}

TEST(FlagTable, ParseIntList) {
  EXPECT_EQ(parse_int_list("--ids", "0,7,2147483647", 0, INT32_MAX),
            (std::vector<int64_t>{0, 7, 2147483647}));
  expect_error([] { parse_int_list("--ids", "-1", 0, INT32_MAX); }, "--ids");
  expect_error([] { parse_int_list("--ids", " 1", 0, INT32_MAX); }, "--ids");
  expect_error([] { split_list("--x", ","); }, "--x");
}

}  // namespace
}  // namespace tessera::cli
