// `tessera train` flag parsing through its cli::Args table: valid flags map to options, nonsense
// throws.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "test_util/expect_error.h"

#include "apps/cli/train_flags.h"
#include "core/error.h"

namespace tessera::cli {
namespace {

train::TrainOptions parse(const std::vector<std::string>& argv, bool* resume) {
  const Args a(train_flags(), argv);
  return parse_train_options(a, resume);
}

using tessera::test::expect_error;

TEST(TrainFlags, ValidFlagsMapToOptions) {
  bool resume = true;
  const auto o = parse({"--model",
                        "gpt2-small",
                        "--data",
                        "d/",
                        "--batch",
                        "8",
                        "--seq",
                        "512",
                        "--grad-accum",
                        "4",
                        "--precision",
                        "bf16",
                        "--recompute",
                        "block",
                        "--lr",
                        "6e-4",
                        "--warmup=200",
                        "--schedule",
                        "cosine",
                        "--steps",
                        "5000",
                        "--eval-every",
                        "100",
                        "--early-stop",
                        "5",
                        "--checkpoint-every",
                        "500",
                        "--threads",
                        "2",
                        "--out",
                        "runs/x",
                        "--quiet"},
                       &resume);
  EXPECT_FALSE(resume);
  EXPECT_EQ(o.model, "gpt2-small");
  EXPECT_EQ(o.batch, 8);
  EXPECT_EQ(o.seq, 512);
  EXPECT_EQ(o.grad_accum, 4);
  EXPECT_EQ(o.precision, "bf16");
  EXPECT_EQ(o.recompute, "block");
  EXPECT_DOUBLE_EQ(o.lr, 6e-4);
  EXPECT_EQ(o.warmup, 200);
  EXPECT_EQ(o.steps, 5000);
  EXPECT_EQ(o.early_stop, 5);
  EXPECT_EQ(o.checkpoint_every, 500);
  EXPECT_TRUE(o.quiet);
  // Options survive the JSON stored in checkpoints.
  const auto back = train::options_from_json(train::options_to_json(o), "test");
  EXPECT_EQ(train::options_to_json(back), train::options_to_json(o));
}

TEST(TrainFlags, NonsenseThrowsNamingTheFlag) {
  bool r = false;
  const std::vector<std::string> base = {"--data", "d", "--out", "o"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = base;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  expect_error([&] { parse(with({"--bogus", "1"}), &r); }, "--bogus");
  expect_error([&] { parse(with({"--batch", "many"}), &r); }, "--batch");
  expect_error([&] { parse(with({"--batch", "0"}), &r); }, "--batch");
  expect_error([&] { parse(with({"--lr", "-1"}), &r); }, "--lr");
  expect_error([&] { parse(with({"--precision", "fp8"}), &r); }, "--precision");
  expect_error([&] { parse(with({"--recompute", "most"}), &r); }, "--recompute");
  expect_error([&] { parse(with({"--schedule", "wavy"}), &r); }, "--schedule");
  expect_error(
      [&] {
        parse(with({"--early-stop", "3", "--eval-every", "0"}), &r);
      },
      "--early-stop");
  expect_error([&] { parse({"--out", "o"}, &r); }, "--data");
  expect_error([&] { parse({"--resume", "somewhere", "--lr", "1e-3"}, &r); }, "--lr");
  expect_error([&] { parse(with({"--steps"}), &r); }, "--steps");
  // A GPU trains in bf16: checked with the flags, before any device is asked for.
  expect_error(
      [&] {
        parse(with({"--device", "cuda", "--precision", "f32"}), &r);
      },
      "--device cuda trains with --precision bf16");
}

TEST(TrainFlags, EveryOptionNamesItsFlag) {
  // validate_options names options through train_flag_of: each field of run.json must come out
  // as a flag of train (or, for the adapters, of finetune).
  std::set<std::string> flags = {"--lora", "--lora-alpha", "--lora-targets"};
  for (const Flag& f : train_flags()) flags.insert(f.name);
  const auto fields = nlohmann::json::parse(train::options_to_json({}));
  for (const auto& [field, value] : fields.items()) {
    if (field == "save_model") continue;  // no flag: the commands always save the model
    EXPECT_TRUE(flags.count(train_flag_of(field))) << field << " -> " << train_flag_of(field);
  }
  EXPECT_EQ(train_flag_of("grad_accum"), "--grad-accum");
  EXPECT_EQ(train_flag_of("data_dir"), "--data");
}

}  // namespace
}  // namespace tessera::cli
