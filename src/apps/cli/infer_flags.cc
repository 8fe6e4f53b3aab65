// Model + tokenizer loading and the flag parsers shared by the inference commands.
#include "apps/cli/infer_flags.h"

#include "backend/device.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "nlohmann/json.hpp"

namespace tessera::cli {

LoadedModel load_model_and_tokenizer(const std::string& path, const model::DecoderLoadOptions& opts,
                                     bool tokenizer_optional) {
  LoadedModel m;
  m.model = model::load_decoder(path, opts);
  const bool gguf_has_tokenizer = m.model.gguf && m.model.gguf->has("tokenizer.ggml.model");
  const bool folder_has_tokenizer =
      !m.model.gguf && file_exists((std::filesystem::path(path) / "tokenizer.json").string());
  if (tokenizer_optional && !gguf_has_tokenizer && !folder_has_tokenizer) return m;
  m.has_tokenizer = true;
  if (m.model.gguf) {
    m.tok = tokenizer::Tokenizer::from_gguf(*m.model.gguf);
    if (m.model.gguf->has("tokenizer.chat_template"))
      m.chat_template = m.model.gguf->get_string("tokenizer.chat_template");
  } else {
    const std::string tok_path = (std::filesystem::path(path) / "tokenizer.json").string();
    TS_CHECK(file_exists(tok_path), "[model] ", path, ": no tokenizer.json in the folder");
    m.tok = tokenizer::Tokenizer::load_json(tok_path);
    // HF keeps the chat template in tokenizer_config.json.
    const std::string cfg = (std::filesystem::path(path) / "tokenizer_config.json").string();
    if (file_exists(cfg)) {
      const auto j = nlohmann::json::parse(read_text_file(cfg), nullptr, false);
      TS_CHECK(!j.is_discarded() && j.is_object(), "[model] ", cfg, ": not a JSON object");
      if (j.contains("chat_template")) {
        const auto& t = j["chat_template"];
        // A string, or a list of {name, template} where "default" is the one to use.
        if (t.is_string()) m.chat_template = t.get<std::string>();
        if (t.is_array())
          for (const auto& e : t)
            if (e.is_object() && e.value("name", "") == "default" && e["template"].is_string())
              m.chat_template = e["template"].get<std::string>();
      }
    }
  }
  TS_CHECK(m.tok.vocab_size() <= m.model.config.vocab, "[model] ", path, ": the tokenizer has ",
           m.tok.vocab_size(), " tokens, more than the model's ", m.model.config.vocab, " rows");
  return m;
}

model::DecoderLoadOptions engine_load_options(const EngineFlags& f) {
  model::DecoderLoadOptions o;
  o.mmap = f.mmap;
  // TESSERA_CPU_LAYOUT=0 keeps the file's layout (to measure what the rearrangement buys).
  const char* env = std::getenv("TESSERA_CPU_LAYOUT");
  o.cpu_layout = !f.cuda && !(env && std::string(env) == "0");
  return o;
}

EngineFlags parse_engine_flags(Args& a) {
  EngineFlags f;
  f.model_path = a.str("--model", kDefaultModel);
  f.threads = a.i64("--threads", 0, 0, 4096);
  if (f.threads > 0) f.pool = std::make_shared<ThreadPool>(static_cast<int>(f.threads));
  f.ctx = a.i64("--ctx", 0, 0, int64_t{1} << 24);
  f.mmap = a.has("--mmap");
  const std::string device = a.str("--device", "cpu");
  TS_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda, not '", device, "'");
  // Checked here, before the model loads: a build without CUDA or a machine without a GPU says
  // so at once instead of after reading gigabytes of weights.
  f.cuda = device == "cuda";
  if (f.cuda)
    TS_CHECK(backend::cuda_device_count() > 0,
             "[cuda] --device cuda: ", backend::cuda_device_summary());
  const std::string kv = a.str("--kv-type", "f16");
  TS_CHECK(kv == "f16" || kv == "f32", "--kv-type must be f16 or f32, not '", kv, "'");
  f.kv_type = kv == "f16" ? DType::f16 : DType::f32;
  // The engine's activation buffers hold this many rows (about 90 KB per row for a 1B model);
  // a longer prompt runs in chunks of it. 0 lets the engine choose (infer::EngineOptions).
  f.chunk_rows = a.i64("--chunk-rows", f.chunk_rows, 0, 65536);
  return f;
}

infer::EngineOptions engine_options(const EngineFlags& f, const model::DecoderModel& model,
                                    int64_t sequences) {
  infer::EngineOptions o;
  o.ctx.pool = f.pool.get();
  o.max_ctx = f.ctx > 0 ? f.ctx : std::min<int64_t>(model.config.max_ctx, 4096);
  TS_CHECK(o.max_ctx <= model.config.max_ctx, "--ctx ", o.max_ctx,
           " is longer than the model's context length ", model.config.max_ctx);
  o.kv_tokens = o.max_ctx * sequences;
  o.kv_type = f.kv_type;
  o.max_rows = f.chunk_rows;
  if (f.cuda) o.ctx.device = ops::Device::cuda;
  return o;
}

infer::SamplingParams parse_sampling_flags(Args& a) {
  infer::SamplingParams p;
  p.temperature = static_cast<float>(a.f64("--temperature", p.temperature, 0, 100));
  p.top_k = a.i64("--top-k", p.top_k, 0, int64_t{1} << 24);
  p.top_p = static_cast<float>(a.f64("--top-p", p.top_p, 1e-6, 1));
  p.min_p = static_cast<float>(a.f64("--min-p", p.min_p, 0, 0.999999));
  p.repetition_penalty = static_cast<float>(a.f64("--repeat-penalty", 1.0, 1e-3, 100));
  p.penalty_last_n = a.i64("--repeat-last-n", p.penalty_last_n, 0, int64_t{1} << 24);
  p.frequency_penalty = static_cast<float>(a.f64("--frequency-penalty", 0, -2, 2));
  p.presence_penalty = static_cast<float>(a.f64("--presence-penalty", 0, -2, 2));
  p.seed = static_cast<uint64_t>(a.i64("--seed", 0, 0, int64_t{1} << 62));
  p.validate();
  return p;
}

}  // namespace tessera::cli
