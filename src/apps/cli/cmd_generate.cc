// `tessera generate`: prompt in, text out, streamed as it is decoded; the chat template of the
// model is applied unless --raw. --batch N decodes N samples of the prompt together.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "core/error.h"
#include "infer/generate.h"
#include "profile/power.h"

namespace tessera::cli {
namespace {

// Samples of one prompt: the prompt ran once; the decode rate counts every sample's tokens over
// the longest decode.
// joules: what the run used by the machine's counters (-1: none readable, and nothing said).
void print_stats(const std::vector<infer::GenerateResult>& rs, const LoadedModel& m, double joules,
                 const char* source) {
  const infer::GenerateResult& r = rs[0];
  double gen = 0, decode_s = 0;
  for (const infer::GenerateResult& x : rs) {
    gen += static_cast<double>(x.tokens.size());
    decode_s = std::max(decode_s, x.decode_seconds);
  }
  const double decode_tps = decode_s > 0 ? gen / decode_s : 0;
  const auto sequences = static_cast<double>(rs.size());
  std::fprintf(stderr,
               "\n[%s] prompt %lld tokens in %.3f s (%.1f tokens/s) | generated %.0f tokens in "
               "%.3f s (%.1f tokens/s, %.2f GB/s of weights) | finish: %s\n",
               m.model.config.name.c_str(), static_cast<long long>(r.prompt_tokens),
               r.prefill_seconds, r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0.0,
               gen, decode_s, decode_tps,
               decode_tps / sequences * static_cast<double>(m.model.weight_bytes_per_token()) / 1e9,
               infer::finish_reason_name(r.finish_reason));
  if (joules >= 0)
    std::fprintf(
        stderr, "energy: %s\n",
        profile::energy_text(joules, gen + static_cast<double>(r.prompt_tokens), source).c_str());
}

int run(const Args& a) {
  const EngineFlags ef = parse_engine_flags(a);
  const std::string prompt = a.str("--prompt");
  const int64_t n = a.i64("--tokens");
  const bool raw = a.on("--raw");
  const std::string system = a.str("--system");
  const std::string format = a.str("--chat-template");
  const std::string stop = a.str("--stop");
  const int64_t batch = a.i64("--batch");
  const bool stats = !a.on("--no-stats");
  infer::GenerateRequest req;
  req.sampling = parse_sampling_flags(a);

  const LoadedModel m = load_engine_model(ef);
  const infer::ChatPrompt cp = make_cli_prompt(m, {{"user", prompt}}, system, raw, format);
  req.prompt = cp.tokens;
  req.max_new_tokens = n;
  req.stop_tokens = m.tok.end_of_generation_tokens();
  req.stop_strings = cp.stop_strings;
  if (!stop.empty()) req.stop_strings.push_back(stop);
  req.continuation = raw;  // printed right after the prompt
  infer::Engine engine(m.model, engine_options(ef, m.model, batch));
  const profile::EnergyMeter meter;
  const profile::EnergySample e0 = meter.sample();
  auto joules = [&] { return meter.joules_between(e0, meter.sample()); };

  if (batch == 1) {
    if (raw) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    const infer::GenerateResult r = infer::generate(engine, m.tok, req, [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    if (stats) print_stats({r}, m, joules(), meter.source_name());
    return 0;
  }
  // One request with `batch` samples (seeds seed+i): the prompt runs once, its cache blocks
  // shared by every sample.
  req.n = batch;
  const std::vector<infer::GenerateResult> rs = infer::generate_batch(engine, m.tok, {req});
  for (size_t i = 0; i < rs.size(); ++i)
    std::printf("--- sample %zu (%s)\n%s\n", i, infer::finish_reason_name(rs[i].finish_reason),
                rs[i].text.c_str());
  if (stats) print_stats(rs, m, joules(), meter.source_name());
  return 0;
}

const Registrar reg({
    "generate",
    "generate text from a GGUF file or HF folder (streamed)",
    join({engine_flags(),
          {
              Flag::text("--prompt", "", "the prompt (a user message unless --raw)").required(),
              Flag::integer("--tokens", 128, 0, int64_t{1} << 24, "most tokens to generate"),
              Flag::toggle("--raw", "the prompt as is, without the chat template"),
              Flag::text("--system", "", "system prompt (replaces the template's default)"),
              Flag::text("--chat-template", "",
                         "a built-in format (chatml, llama2, llama3, zephyr, raw) instead of the "
                         "model's own template",
                         "NAME"),
              Flag::text("--stop", "", "also stop at this string"),
              Flag::integer("--batch", 1, 1, 4096,
                            "decode this many samples of the prompt together (seeds seed+i)"),
              Flag::toggle("--no-stats", "no speed line on stderr at the end"),
          },
          sampling_flags()}),
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
