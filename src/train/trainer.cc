// Training loop, evaluation, early stopping and run outputs.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "core/file_io.h"
#include "model/decoder_save.h"
#include "model/lora.h"
#include "ops/memory.h"
#include "profile/power.h"
#include "profile/probe.h"
#include "profile/timer.h"
#include "tokenizer/tokenizer.h"
#include "train/progress.h"
#include "train/step.h"
#include "train/svg_plot.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCsvHeader = "step,loss,val_loss,lr,tokens_per_s,gflops,grad_norm,elapsed_s";

std::string path_in(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

std::string fmt(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

model::TrainConfig build_config(const TrainOptions& o, int64_t vocab) {
  model::TrainConfig c = model::TrainConfig::preset(o.model, vocab);
  if (o.n_layer > 0) c.n_layer = o.n_layer;
  if (o.n_head > 0) c.n_head = o.n_head;
  if (o.n_embd > 0) c.n_embd = o.n_embd;
  if (o.max_seq > 0) c.max_seq = o.max_seq;
  c.validate();
  return c;
}

// Rows of train.csv as (step, loss, val_loss); empty cells read as NaN.
struct CsvRow {
  int64_t step;
  double loss, val;
  std::string line;
};
std::vector<CsvRow> read_csv(const std::string& path) {
  std::vector<CsvRow> rows;
  std::ifstream in(path);
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (first) {
      first = false;
      continue;
    }
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    if (cells.size() < 3) continue;
    auto num = [](const std::string& s) {
      return s.empty() ? std::numeric_limits<double>::quiet_NaN() : std::strtod(s.c_str(), nullptr);
    };
    rows.push_back(
        {std::strtoll(cells[0].c_str(), nullptr, 10), num(cells[1]), num(cells[2]), line});
  }
  return rows;
}

}  // namespace

TrainOptions resume_options(const std::string& dir) {
  const CheckpointInfo info = read_checkpoint_info(dir);
  TrainOptions o = options_from_json(info.options_json, checkpoint_path(dir));
  o.out_dir = dir;
  o.stop_at = 0;
  return o;
}

Trainer::Trainer(const TrainOptions& opts, bool resume, OptionNamer namer) : opts_(opts) {
  validate_options(opts_, namer);
  auto n = [namer](std::string_view field) { return option_name(namer, field); };
  if (opts_.threads > 0) pool_ = std::make_unique<ThreadPool>(static_cast<int>(opts_.threads));
  ops::Context ctx;
  ctx.pool = pool_.get();
  ctx.observer = opts_.observer;
  // cuda: the model's own step, its tensors in the memory of the CUDA ops backend.
  if (opts_.device == "cuda") ctx.device = ops::Device::cuda;
  train_data_ = load_split(opts_.data_dir, "train");
  val_data_ = load_split(opts_.data_dir, "val");
  const int64_t data_vocab = std::max(train_data_.vocab, val_data_.vocab);

  if (opts_.lora_rank > 0) {
    // The base from its file again on resume: the checkpoint holds the adapters only.
    model_ = model::load_lora_trainable(opts_.init_from, lora_spec(opts_), ctx);
    if (resume) {
      const model::TrainConfig saved = read_checkpoint_info(opts_.out_dir).config;
      TS_CHECK(saved.n_layer == model_->config().n_layer &&
                   saved.n_embd == model_->config().n_embd &&
                   saved.vocab_size == model_->config().vocab_size &&
                   saved.ff() == model_->config().ff() &&
                   saved.kv_heads() == model_->config().kv_heads(),
               "[train] resuming ", opts_.out_dir,
               ": the checkpoint's adapters were trained on another shape of model than ",
               opts_.init_from, " has now");
    }
  } else if (resume) {
    model_ = std::make_unique<model::TrainModel>(read_checkpoint_info(opts_.out_dir).config, ctx);
  } else if (!opts_.init_from.empty()) {
    model_ = model::load_trainable(opts_.init_from, ctx);
    TS_CHECK(opts_.vocab_size == 0 || opts_.vocab_size == model_->config().vocab_size, "[train] ",
             n("vocab_size"), " ", opts_.vocab_size, " differs from the vocabulary of ",
             n("init_from"), " '", opts_.init_from, "' (", model_->config().vocab_size, ")");
  } else {
    const int64_t vocab = opts_.vocab_size > 0 ? opts_.vocab_size : data_vocab;
    model_ = std::make_unique<model::TrainModel>(build_config(opts_, vocab), ctx);
  }
  const model::TrainConfig& cfg = model_->config();
  TS_CHECK(data_vocab <= cfg.vocab_size, "[train] data in '", opts_.data_dir,
           "' has vocabulary size ", data_vocab, ", larger than the model's ", cfg.vocab_size,
           (opts_.vocab_size > 0 ? " (" + n("vocab_size") + ")" : ""));
  TS_CHECK(opts_.seq <= cfg.max_seq, "[train] ", n("seq"), " ", opts_.seq,
           " exceeds the model's max_seq ", cfg.max_seq);
  model_->plan(opts_.batch, opts_.seq, model::parse_precision(opts_.precision),
               model::parse_recompute(opts_.recompute));
  if (!resume && (opts_.init_from.empty() || model_->is_lora())) model_->init_weights(opts_.seed);
  model_->params_updated();

  AdamWConfig ac;
  ac.beta1 = static_cast<float>(opts_.beta1);
  ac.beta2 = static_cast<float>(opts_.beta2);
  ac.weight_decay = static_cast<float>(opts_.weight_decay);
  ac.clip = static_cast<float>(opts_.clip);
  opt_ = std::make_unique<AdamW>(model_->tensors(), ac, ctx);
  loader_ = std::make_unique<BatchLoader>(train_data_, opts_.seq, opts_.seed);
  val_loader_ = std::make_unique<ValLoader>(val_data_, opts_.seq);

  sched_.kind = parse_schedule(opts_.schedule);
  sched_.max_lr = opts_.lr;
  sched_.min_lr_fraction = opts_.min_lr_fraction;
  sched_.warmup_steps = opts_.warmup;
  sched_.total_steps = opts_.steps;

  Rng trainer_rng(opts_.seed ^ 0x5eed5eed5eed5eedull);
  std::copy(trainer_rng.state(), trainer_rng.state() + 4, st_.rng);
  st_.loader = loader_->position();
  if (resume) {
    st_ = load_checkpoint(opts_.out_dir, *model_, *opt_);
    loader_->set_position(st_.loader);
  }
  inputs_.resize(static_cast<size_t>(opts_.batch * opts_.seq));
  targets_.resize(inputs_.size());
}

Trainer::~Trainer() = default;

double Trainer::evaluate() {
  const int64_t B = opts_.batch, T = opts_.seq;
  const int64_t n = std::min(opts_.eval_batches, (val_loader_->num_windows() + B - 1) / B);
  double sum = 0;
  for (int64_t b = 0; b < n; ++b) {
    val_loader_->batch(b, B, inputs_.data(), targets_.data());
    sum += model_->forward(inputs_.data(), targets_.data(), B, T);
  }
  return sum / static_cast<double>(n);
}

void Trainer::write_csv_row(int64_t step, double loss, double val, double lr, double tps,
                            double gflops, double norm, double elapsed) {
  std::ofstream out(path_in(opts_.out_dir, "train.csv"), std::ios::app);
  out << step << ',' << fmt(loss) << ',' << fmt(val) << ',' << fmt(lr) << ',' << fmt(tps) << ','
      << fmt(gflops) << ',' << fmt(norm) << ',' << fmt(elapsed) << '\n';
  TS_CHECK(out.good(), "[train] cannot write ", path_in(opts_.out_dir, "train.csv"));
}

TrainResult Trainer::run() {
  const int64_t B = opts_.batch, T = opts_.seq, GA = opts_.grad_accum;
  make_dirs(opts_.out_dir);
  const std::string opts_json = options_to_json(opts_);
  write_file_atomic(path_in(opts_.out_dir, "run.json"), opts_json + "\n");

  // The CSV keeps rows up to the restored step: rows written after the last checkpoint of an
  // interrupted run are dropped, since those steps are about to be redone.
  const std::string csv = path_in(opts_.out_dir, "train.csv");
  std::string csv_text = std::string(kCsvHeader) + "\n";
  if (st_.step > 0 && file_exists(csv))
    for (const auto& r : read_csv(csv))
      if (r.step <= st_.step) csv_text += r.line + "\n";
  write_file_atomic(csv, csv_text);

  const double fpt = model_->flops_per_token_train(T);
  double peak = 0;
  if (!opts_.quiet) {
    if (opts_.peak_gflops > 0 || opts_.device != "cpu") {
      peak = opts_.peak_gflops;
    } else {
      const auto peaks = profile::cached_peaks(model_->context().threads().size());
      peak = opts_.precision == "bf16" && peaks.bf16_gflops_all > 0 ? peaks.bf16_gflops_all
                                                                    : peaks.f32_gflops_all;
    }
  }
  Progress progress(opts_.quiet ? nullptr : stdout, isatty(fileno(stdout)) != 0, opts_.log_every,
                    fpt, peak);
  const profile::Timer run_timer;
  const profile::EnergyMeter meter;  // the run's joules where RAPL or NVML is readable
  const profile::EnergySample energy_at_start = meter.sample();
  const int64_t first_step = st_.step;
  TrainResult res;
  res.last_loss = std::numeric_limits<double>::quiet_NaN();
  double last_val = std::numeric_limits<double>::quiet_NaN();
  bool evaluated_now = false;

  const int64_t end_step = opts_.stop_at > 0 ? std::min(opts_.stop_at, opts_.steps) : opts_.steps;
  while (st_.step < end_step && !st_.early_stopped) {
    const profile::Timer step_timer;
    const double lr = sched_.at(st_.step);
    const StepResult r = train_step(
        *model_, *opt_, B, T, GA, lr, st_.step + 1,
        [&](int32_t* in, int32_t* tg) { loader_->next(B, in, tg); }, inputs_.data(),
        targets_.data());
    const double loss = r.loss, norm = r.grad_norm;
    ++st_.step;
    st_.loader = loader_->position();
    const double dt = step_timer.seconds();
    const double tps = static_cast<double>(B * T * GA) / std::max(dt, 1e-9);
    res.last_loss = loss;

    // Scheduled evaluations drive early stopping; the extra one at the end of a run does not, so
    // an interrupted-and-resumed run makes exactly the decisions of an uninterrupted one.
    double val = std::numeric_limits<double>::quiet_NaN();
    evaluated_now = false;
    if (opts_.eval_every > 0 && st_.step % opts_.eval_every == 0) {
      val = evaluate();
      evaluated_now = true;
      if (st_.evals == 0 || val < st_.best_val) {
        st_.best_val = val;
        st_.bad_evals = 0;
      } else {
        ++st_.bad_evals;
      }
      ++st_.evals;
      if (opts_.early_stop > 0 && st_.bad_evals >= opts_.early_stop) {
        st_.early_stopped = true;
        progress.message(cat("early stop at step ", st_.step, ": validation loss has not improved ",
                             "for ", st_.bad_evals, " evaluations (best ", fmt(st_.best_val), ")"));
      }
    }
    if (!evaluated_now && (st_.step == end_step || st_.early_stopped)) {
      val = evaluate();
      evaluated_now = true;
    }
    if (evaluated_now) last_val = val;
    write_csv_row(st_.step, loss, val, lr, tps, fpt * tps * 1e-9, norm, run_timer.seconds());
    ProgressStats ps{st_.step, opts_.steps, loss, lr, tps, norm, run_timer.seconds()};
    progress.update(ps, dt);
    if (evaluated_now) progress.message(cat("step ", st_.step, ": val loss ", fmt(val)));

    if (opts_.checkpoint_every > 0 && st_.step % opts_.checkpoint_every == 0 &&
        st_.step < end_step && !st_.early_stopped) {
      save_checkpoint(opts_.out_dir, *model_, *opt_, st_, opts_json);
      progress.message(cat("checkpoint at step ", st_.step));
    }
  }
  if (!evaluated_now) last_val = evaluate();  // nothing ran: report the restored model
  progress.finish();

  save_checkpoint(opts_.out_dir, *model_, *opt_, st_, opts_json);
  finish_outputs(st_.step >= opts_.steps || st_.early_stopped);
  res.steps_done = st_.step;
  res.last_val = last_val;
  res.best_val = st_.evals > 0 ? st_.best_val : last_val;
  res.early_stopped = st_.early_stopped;
  res.joules = meter.joules_between(energy_at_start, meter.sample());
  res.tokens_trained = (st_.step - first_step) * B * T * GA;
  if (!opts_.quiet) {
    std::printf("done: %lld steps, val loss %s (best %s)%s; outputs in %s\n",
                static_cast<long long>(st_.step), fmt(last_val).c_str(), fmt(res.best_val).c_str(),
                st_.early_stopped ? ", stopped early" : "", opts_.out_dir.c_str());
    std::printf("energy: %s\n",
                profile::energy_text(res.joules, static_cast<double>(res.tokens_trained),
                                     meter.source_name())
                    .c_str());
  }
  return res;
}

void Trainer::finish_outputs(bool finished) {
  const std::string tok = path_in(opts_.data_dir, "tokenizer.json");
  if (opts_.save_model && finished && model_->is_lora()) {
    // The adapter in PEFT's layout, in the run's folder itself: model::apply_peft_adapter loads it.
    ops::HostMirror<const float> params(model_->context(), model_->params(), model_->num_params(),
                                        ops::HostMirror<const float>::read);
    model::save_peft_adapter(model::as_decoder(*model_, params.data()), model_->lora(),
                             opts_.init_from, opts_.out_dir);
  } else if (opts_.save_model && finished) {
    // The inference writer, through a view of the parameters: one HF writer for every model.
    const std::string mdir = path_in(opts_.out_dir, "model");
    const std::string tok_text = file_exists(tok) ? read_text_file(tok) : "";
    ops::HostMirror<const float> params(model_->context(), model_->params(), model_->num_params(),
                                        ops::HostMirror<const float>::read);
    model::DecoderModel d = model::as_decoder(*model_, params.data());
    if (!opts_.init_from.empty()) {  // the model it was tuned from, by its own name
      model::DecoderLoadOptions lo;
      lo.mmap = true;
      d.config.name = model::load_decoder(opts_.init_from, lo).config.name + " (fine-tuned)";
    }
    model::save_decoder_hf(d, mdir, DType::f32, tok_text);
    // Chat data carries the template it was rendered with (chat_data.h): the saved model
    // keeps it.
    const std::string tmpl_path = path_in(opts_.data_dir, "chat_template.jinja");
    const std::string tmpl = file_exists(tmpl_path) ? read_text_file(tmpl_path) : "";
    if (!tok_text.empty())
      tokenizer::write_hf_tokenizer_config(
          mdir, tokenizer::Tokenizer::from_json_text(tok_text, tok), tmpl);
  }
  if (file_exists(tok))
    write_file_atomic(path_in(opts_.out_dir, "tokenizer.json"), read_text_file(tok));

  Series tr{"train", "#1f77b4", {}}, va{"validation", "#d62728", {}};
  for (const auto& r : read_csv(path_in(opts_.out_dir, "train.csv"))) {
    if (std::isfinite(r.loss)) tr.points.emplace_back(static_cast<double>(r.step), r.loss);
    if (std::isfinite(r.val)) va.points.emplace_back(static_cast<double>(r.step), r.val);
  }
  if (!tr.points.empty() || !va.points.empty())
    write_file_atomic(path_in(opts_.out_dir, "loss.svg"),
                      line_chart_svg({tr, va}, "Loss", "step", "cross-entropy (nats)"));
}

}  // namespace tessera::train
