// `tessera chat`: an interactive conversation with the model's chat template. The conversation
// stays in the KV cache between turns: each turn runs only the tokens the cache lacks.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "core/error.h"
#include "infer/generate.h"

namespace tessera::cli {
namespace {

int run(const Args& a) {
  const EngineFlags ef = parse_engine_flags(a);
  const std::string system = a.str("--system");
  const std::string format = a.str("--chat-template");
  const int64_t n = a.i64("--tokens");
  const bool stats = !a.on("--no-stats");
  // A first message given on the command line (then the conversation continues from stdin).
  const std::string first = a.str("--prompt");
  infer::GenerateRequest req;
  req.sampling = parse_sampling_flags(a);

  const LoadedModel m = load_engine_model(ef);
  infer::Engine engine(m.model, engine_options(ef, m.model));
  // One conversation: the prefix cache keeps each turn's blocks, so the next turn runs only the
  // tokens it does not share with the last (the template's re-rendering of the reply included).
  infer::SchedulerOptions so;
  so.max_running = 1;
  infer::Scheduler sched(engine, m.tok, so);
  std::vector<tokenizer::ChatMessage> history;
  const bool interactive = isatty(0);
  std::fprintf(stderr, "chat with %s (%s); an empty line or end of input quits\n",
               m.model.config.name.c_str(), ef.model_path.c_str());
  std::string line = first;
  for (bool use_first = !first.empty();; use_first = false) {
    if (!use_first) {
      if (interactive) std::fputs("> ", stdout), std::fflush(stdout);
      if (!std::getline(std::cin, line) || line.empty()) break;
    }
    history.push_back({"user", line});
    const infer::ChatPrompt cp = make_cli_prompt(m, history, system, false, format);
    req.prompt = cp.tokens;
    req.max_new_tokens = n;
    req.stop_tokens = m.tok.end_of_generation_tokens();
    req.stop_strings = cp.stop_strings;
    // Keep the reply within the context: what is left after the prompt.
    const int64_t room = engine.options().max_ctx - static_cast<int64_t>(req.prompt.size());
    TS_CHECK(room > 0, "[chat] the conversation (", req.prompt.size(),
             " tokens) no longer fits the context of ", engine.options().max_ctx, "; raise --ctx");
    req.max_new_tokens = std::min(n, room);
    const infer::GenerateResult r = infer::generate(sched, req, [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    if (stats)
      std::fprintf(
          stderr, "[%lld new prompt tokens at %.1f tokens/s, %zu tokens at %.1f tokens/s]\n",
          static_cast<long long>(r.computed_prompt_tokens),
          r.prefill_seconds > 0 ? r.computed_prompt_tokens / r.prefill_seconds : 0.0,
          r.tokens.size(), r.decode_seconds > 0 ? r.tokens.size() / r.decode_seconds : 0.0);
    history.push_back({"assistant", r.text});
  }
  return 0;
}

const Registrar reg({
    "chat",
    "interactive chat with a model (its chat template, cached turns)",
    join({engine_flags(),
          {
              Flag::text("--system", "", "system prompt (replaces the template's default)"),
              Flag::text("--chat-template", "",
                         "a built-in format (chatml, llama2, llama3, zephyr, raw) instead of the "
                         "model's own template",
                         "NAME"),
              Flag::integer("--tokens", 512, 1, int64_t{1} << 24, "most tokens per reply"),
              Flag::toggle("--no-stats", "no speed line on stderr after each reply"),
              Flag::text("--prompt", "", "a first message; the conversation continues from stdin"),
          },
          sampling_flags()}),
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
