// TrainOptions <-> JSON and validation.
#include "train/options.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "model/train_model.h"
#include "train/lr_schedule.h"

namespace tessera::train {

namespace {
// One list of fields drives both directions so they cannot drift apart.
template <typename Fn>
void for_each_field(TrainOptions& o, Fn&& fn) {
  fn("model", o.model);
  fn("n_layer", o.n_layer);
  fn("n_head", o.n_head);
  fn("n_embd", o.n_embd);
  fn("max_seq", o.max_seq);
  fn("vocab_size", o.vocab_size);
  fn("init_from", o.init_from);
  fn("lora_rank", o.lora_rank);
  fn("lora_alpha", o.lora_alpha);
  fn("lora_targets", o.lora_targets);
  fn("data_dir", o.data_dir);
  fn("out_dir", o.out_dir);
  fn("batch", o.batch);
  fn("seq", o.seq);
  fn("grad_accum", o.grad_accum);
  fn("precision", o.precision);
  fn("recompute", o.recompute);
  fn("device", o.device);
  fn("lr", o.lr);
  fn("min_lr_fraction", o.min_lr_fraction);
  fn("warmup", o.warmup);
  fn("schedule", o.schedule);
  fn("steps", o.steps);
  fn("stop_at", o.stop_at);
  fn("weight_decay", o.weight_decay);
  fn("clip", o.clip);
  fn("beta1", o.beta1);
  fn("beta2", o.beta2);
  fn("eval_every", o.eval_every);
  fn("eval_batches", o.eval_batches);
  fn("early_stop", o.early_stop);
  fn("checkpoint_every", o.checkpoint_every);
  fn("threads", o.threads);
  fn("seed", o.seed);
  fn("log_every", o.log_every);
  fn("quiet", o.quiet);
  fn("save_model", o.save_model);
}
}  // namespace

std::string options_to_json(const TrainOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  TrainOptions copy = o;
  for_each_field(copy, [&](const char* k, const auto& v) { j[k] = v; });
  return j.dump(2);
}

TrainOptions options_from_json(const std::string& json, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    fail("[train] ", source, ": run options are not valid JSON: ", e.what());
  }
  TS_CHECK(j.is_object(), "[train] ", source, ": run options must be a JSON object");
  TrainOptions o;
  for_each_field(o, [&](const char* k, auto& v) {
    if (!j.contains(k)) return;
    try {
      j.at(k).get_to(v);
    } catch (const std::exception& e) {
      fail("[train] ", source, ": run option '", k, "' has the wrong type: ", e.what());
    }
  });
  return o;
}

std::string option_name(OptionNamer namer, std::string_view field) {
  return namer ? namer(field) : std::string(field);
}

void validate_options(const TrainOptions& o, OptionNamer namer) {
  // Messages name each option as the caller knows it: a field of run.json, or a command's flag.
  auto n = [namer](std::string_view field) { return option_name(namer, field); };
  TS_CHECK(!o.data_dir.empty(), "[train] ", n("data_dir"), " is required");
  TS_CHECK(!o.out_dir.empty(), "[train] ", n("out_dir"), " is required");
  TS_CHECK(o.batch >= 1, "[train] ", n("batch"), " must be >= 1, got ", o.batch);
  TS_CHECK(o.seq >= 1, "[train] ", n("seq"), " must be >= 1, got ", o.seq);
  TS_CHECK(o.grad_accum >= 1, "[train] ", n("grad_accum"), " must be >= 1, got ", o.grad_accum);
  TS_CHECK(o.steps >= 0, "[train] ", n("steps"), " must be >= 0, got ", o.steps);
  TS_CHECK(o.lr > 0, "[train] ", n("lr"), " must be positive, got ", o.lr);
  TS_CHECK(o.stop_at >= 0, "[train] ", n("stop_at"), " must be >= 0, got ", o.stop_at);
  TS_CHECK(o.warmup >= 0, "[train] ", n("warmup"), " must be >= 0, got ", o.warmup);
  TS_CHECK(o.eval_every >= 0, "[train] ", n("eval_every"), " must be >= 0, got ", o.eval_every);
  TS_CHECK(o.eval_batches >= 1, "[train] ", n("eval_batches"), " must be >= 1, got ",
           o.eval_batches);
  TS_CHECK(o.early_stop >= 0, "[train] ", n("early_stop"), " must be >= 0, got ", o.early_stop);
  TS_CHECK(o.early_stop == 0 || o.eval_every > 0, "[train] ", n("early_stop"), " needs ",
           n("eval_every"), " > 0");
  TS_CHECK(o.checkpoint_every >= 0, "[train] ", n("checkpoint_every"), " must be >= 0, got ",
           o.checkpoint_every);
  TS_CHECK(o.vocab_size >= 0, "[train] ", n("vocab_size"), " must be >= 0, got ", o.vocab_size);
  if (o.init_from.empty()) model::TrainConfig::preset(o.model, 1);  // throws naming the preset
  model::parse_precision(o.precision, n("precision"));
  model::parse_recompute(o.recompute, n("recompute"));
  parse_schedule(o.schedule, n("schedule"));
  TS_CHECK(o.device == "cpu" || o.device == "cuda", "[train] ", n("device"),
           " must be cpu or cuda, not '", o.device, "'");
  TS_CHECK(o.device == "cpu" || o.precision == "bf16", "[train] ", n("device"),
           " cuda trains with ", n("precision"), " bf16 (got ", n("precision"), " ", o.precision,
           ")");
  TS_CHECK(o.lora_rank >= 0, "[train] ", n("lora_rank"), " must be >= 0, got ", o.lora_rank);
  TS_CHECK(o.lora_alpha >= 0, "[train] ", n("lora_alpha"), " must be positive, got ", o.lora_alpha);
  if (o.lora_rank > 0) {
    TS_CHECK(!o.init_from.empty(), "[train] ", n("lora_rank"), " needs a model to adapt (",
             n("init_from"), ")");
    TS_CHECK(o.precision == "f32", "[train] ", n("lora_rank"),
             " trains in f32 (the base's products run in its stored type); drop ", n("precision"),
             " ", o.precision);
    TS_CHECK(o.device == "cpu", "[train] ", n("lora_rank"),
             " runs on the CPU: the CUDA step needs bf16 precision, which LoRA does not use");
    model::parse_lora_targets(o.lora_targets, n("lora_targets"));
  }
}

model::LoraSpec lora_spec(const TrainOptions& o) {
  model::LoraSpec s;
  s.rank = o.lora_rank;
  s.alpha = o.lora_alpha > 0 ? o.lora_alpha : 2.0 * static_cast<double>(o.lora_rank);
  s.targets = model::parse_lora_targets(o.lora_targets, "lora_targets");
  return s;
}

}  // namespace tessera::train
