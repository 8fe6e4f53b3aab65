// `tessera sample`: generates text from a trained run (its model/ folder or its checkpoint) or an
// HF GPT-2 folder, streaming decoded tokens to stdout. The training model runs in the inference
// engine (model::as_decoder) with the engine's sampler and generation loop.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/profiling.h"
#include "core/error.h"
#include "core/file_io.h"
#include "infer/generate.h"
#include "model/train_model.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"

namespace tessera::cli {
namespace {

std::string in_dir(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

int run(const Args& a) {
  const std::string dir = a.str("--ckpt");
  const std::string prompt = a.str("--prompt");
  infer::GenerateRequest req;
  req.max_new_tokens = a.i64("--max-tokens");
  // Temperature and top-k only (no top-p or min-p cut), as this command has always sampled.
  req.sampling.temperature = static_cast<float>(a.f64("--temperature"));
  req.sampling.top_k = a.i64("--top-k");
  req.sampling.top_p = 1.0f;
  req.sampling.min_p = 0.0f;
  req.sampling.seed = static_cast<uint64_t>(a.i64("--seed"));
  const int64_t threads = a.i64("--threads");

  // Model: <dir>/model (written at the end of training), <dir> itself if it is an HF folder,
  // else the run's checkpoint.
  std::unique_ptr<ThreadPool> pool;
  if (threads > 0) pool = std::make_unique<ThreadPool>(static_cast<int>(threads));
  ops::Context ctx;
  ctx.pool = pool.get();
  ctx.observer = wrapped_observer();  // `tessera profile` around this command
  std::unique_ptr<model::TrainModel> m;
  std::string model_dir;
  if (file_exists(in_dir(in_dir(dir, "model"), "config.json"))) {
    model_dir = in_dir(dir, "model");
  } else if (file_exists(in_dir(dir, "config.json"))) {
    model_dir = dir;
  }
  if (!model_dir.empty()) {
    m = model::load_trainable(model_dir, ctx);
  } else {
    TS_CHECK(file_exists(train::checkpoint_path(dir)), "[sample] --ckpt '", dir,
             "' holds no model/config.json, config.json or checkpoint.safetensors");
    m = train::load_model_from_checkpoint(dir, ctx);
  }
  std::string tok_path;
  std::vector<std::string> tok_candidates = {in_dir(dir, "tokenizer.json")};
  if (!model_dir.empty()) tok_candidates.push_back(in_dir(model_dir, "tokenizer.json"));
  for (const std::string& p : tok_candidates)
    if (tok_path.empty() && file_exists(p)) tok_path = p;
  TS_CHECK(!tok_path.empty(), "[sample] no tokenizer.json in '", dir, "'",
           model_dir.empty() ? "" : " or its model folder");
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(tok_path);
  TS_CHECK(tok.vocab_size() <= m->config().vocab_size, "[sample] tokenizer ", tok_path, " has ",
           tok.vocab_size(), " tokens, more than the model's vocabulary of ",
           m->config().vocab_size);

  std::vector<int32_t> ids = tok.encode(prompt);
  if (ids.empty()) {
    TS_CHECK(tok.eot_token() >= 0,
             "[sample] empty --prompt and the tokenizer has no "
             "<|endoftext|> token to start from");
    ids.push_back(tok.eot_token());
  }
  const int64_t max_seq = m->config().max_seq;
  TS_CHECK(static_cast<int64_t>(ids.size()) + req.max_new_tokens <= max_seq, "[sample] --prompt (",
           ids.size(), " tokens) plus --max-tokens ", req.max_new_tokens,
           " exceeds the model's context of ", max_seq, " tokens");
  if (tok.eot_token() >= 0) req.stop_tokens.push_back(tok.eot_token());
  req.prompt = std::move(ids);
  req.continuation = true;  // printed right after the prompt

  const model::DecoderModel view = model::as_decoder(*m);
  infer::EngineOptions eo;
  eo.ctx = ctx;
  eo.max_ctx = max_seq;
  eo.kv_type = DType::f32;  // the training model's own precision
  infer::Engine engine(view, eo);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  infer::generate(engine, tok, req, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  return 0;
}

const Registrar reg({
    "sample",
    "generate text from a trained run or a model folder",
    {
        Flag::text("--ckpt", "", "a run's folder (its model/ or checkpoint) or an HF GPT-2 folder",
                   "DIR")
            .required(),
        Flag::text("--prompt", "", "text to continue; empty: start from <|endoftext|>"),
        Flag::integer("--max-tokens", 200, 0, int64_t{1} << 24, "most tokens to generate"),
        Flag::number("--temperature", 1.0, 0.0, 100.0, "sampling temperature; 0: greedy"),
        Flag::integer("--top-k", 0, 0, int64_t{1} << 24, "keep the k most likely; 0: all"),
        Flag::integer("--seed", 1, 0, int64_t{1} << 62, "random seed"),
        Flag::threads(),
    },
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
