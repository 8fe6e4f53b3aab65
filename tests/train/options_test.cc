// Run options' validation names each option as its caller knows it: the field of run.json by
// default (library code names no command-line flag), or what the caller's namer gives.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "test_util/expect_error.h"
#include "train/options.h"

namespace tessera::train {
namespace {

using test::expect_error;

TrainOptions valid() {
  TrainOptions o;
  o.data_dir = "d";
  o.out_dir = "o";
  return o;
}

TEST(TrainOptions, ValidationNamesTheField) {
  validate_options(valid());
  TrainOptions o = valid();
  o.grad_accum = 0;
  expect_error([&] { validate_options(o); }, "[train] grad_accum must be >= 1, got 0");
  o = valid();
  o.early_stop = 3;
  o.eval_every = 0;
  expect_error([&] { validate_options(o); }, "[train] early_stop needs eval_every > 0");
  o = valid();
  o.device = "cuda";
  expect_error([&] { validate_options(o); },
               "[train] device cuda trains with precision bf16 (got precision f32)");
  o = valid();
  o.out_dir.clear();
  expect_error([&] { validate_options(o); }, "[train] out_dir is required");
  o = valid();
  o.precision = "fp8";
  expect_error([&] { validate_options(o); }, "precision must be f32 or bf16, got 'fp8'");
  o = valid();
  o.schedule = "wavy";
  expect_error([&] { validate_options(o); }, "schedule must be constant, cosine or onecycle");
}

TEST(TrainOptions, ValidationNamesThroughTheCallersNamer) {
  TrainOptions o = valid();
  o.early_stop = 3;
  o.eval_every = 0;
  const OptionNamer angle = [](std::string_view f) { return "<" + std::string(f) + ">"; };
  expect_error([&] { validate_options(o, angle); }, "[train] <early_stop> needs <eval_every> > 0");
  o = valid();
  o.recompute = "most";
  expect_error([&] { validate_options(o, angle); }, "<recompute> must be none, gelu or block");
}

}  // namespace
}  // namespace tessera::train
