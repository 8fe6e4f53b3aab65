// `tessera serve`: the OpenAI-compatible server (serve/) over one engine and its scheduler.
// SIGTERM or SIGINT stop it gracefully: new work is refused, running requests get a grace
// period, and the process exits 0.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "core/error.h"
#include "core/file_io.h"
#include "profile/probe.h"
#include "serve/server.h"

namespace tessera::cli {
namespace {

// One key per line; blank lines and lines starting with # are skipped.
std::vector<std::string> read_api_keys(const std::string& path) {
  TS_CHECK(file_exists(path), "--api-key-file ", path, ": no such file");
  std::vector<std::string> keys;
  const std::string text = read_text_file(path);
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t b = 0;
    while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
    line = line.substr(b);
    if (!line.empty() && line[0] != '#') keys.push_back(line);
    at = end + 1;
  }
  TS_CHECK(!keys.empty(), "--api-key-file ", path, ": holds no key (one per line)");
  return keys;
}

int run(const Args& a) {
  // Signals go to one thread that waits for them: blocked before any other thread starts (the
  // engine's pool, the HTTP threads), so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-write is an error return, not death
  const EngineFlags ef = parse_engine_flags(a);
  serve::ServerOptions so;
  so.host = a.str("--host");
  so.port = static_cast<int>(a.i64("--port"));
  so.max_queue = a.i64("--max-queue");
  so.max_body_bytes = static_cast<size_t>(parse_bytes("--max-body", a.str("--max-body")));
  so.request_timeout_seconds = a.f64("--request-timeout");
  so.replica = a.str("--replica-id");
  if (a.given("--api-key-file")) so.api_keys = read_api_keys(a.str("--api-key-file"));
  infer::SchedulerOptions sched;
  sched.max_running = a.i64("--max-batch");
  // A CPU step costs about its rows even at batch 32 (compute-bound), so prompt rows beside
  // decodes are held to about the decodes' number; a GPU's decode step is bound by the weight
  // reads, and prompt rows beside it come almost free.
  sched.step_tokens = a.given("--step-tokens") ? a.i64("--step-tokens") : ef.cuda ? 512 : 64;
  sched.max_step_ratio = a.f64("--max-step-ratio");
  TS_CHECK(sched.max_step_ratio == 0 || sched.max_step_ratio >= 1,
           "--max-step-ratio must be 0 (off) or at least 1, got ", sched.max_step_ratio);
  sched.max_wait_seconds = a.f64("--max-wait");
  sched.prefix_cache = !a.on("--no-prefix-cache");
  const int64_t kv_memory = parse_bytes("--kv-memory", a.str("--kv-memory"));
  const double grace = a.f64("--shutdown-grace");

  const LoadedModel m = load_engine_model(ef);
  so.model_name = a.given("--model-name") ? a.str("--model-name")
                                          : std::filesystem::path(ef.model_path).stem().string();
  TS_CHECK(!so.model_name.empty(), "--model-name is empty");
  infer::EngineOptions eo = engine_options(ef, m.model);
  // The cache: --kv-memory's worth of tokens, at most a full context for every running
  // sequence, and at least one whole context (a request alone must fit).
  const model::DecoderConfig& c = m.model.config;
  const int64_t per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * dtype_bytes(ef.kv_type, 1);
  const int64_t tokens = kv_memory / per_token;
  TS_CHECK(tokens >= eo.max_ctx, "--kv-memory ", a.str("--kv-memory"), " holds ", tokens,
           " tokens of this model's cache (", per_token, " bytes each), less than one context (",
           eo.max_ctx, " tokens, --ctx)");
  eo.kv_tokens = std::min(tokens, eo.max_ctx * sched.max_running);
  // Cached prefixes need every layer's keys: the sliding-window layers keep their whole
  // context with the prefix cache, only their windows' blocks without it.
  eo.max_sequences = sched.prefix_cache ? 0 : sched.max_running;
  infer::Engine engine(m.model, eo);

  const int threads = static_cast<int>(eo.ctx.threads().size());
  so.memory_bandwidth = profile::measure_triad_gbs(threads) * 1e9;

  serve::Server server(m, engine, sched, so);
  const int port = server.bind();
  std::thread([&server, stop_signals, grace] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "[serve] %s: draining (up to %.0f s)\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", grace);
    server.shutdown(grace);
  }).detach();

  std::fprintf(
      stderr,
      "[serve] %s: %s, %lld KV-cache tokens (%.2f GB), batch up to %lld, %d threads on %s\n",
      so.model_name.c_str(), c.name.c_str(), static_cast<long long>(eo.kv_tokens),
      static_cast<double>(engine.kv_bytes()) / 1e9, static_cast<long long>(sched.max_running),
      threads, engine.device_description().c_str());
  if (so.api_keys.empty())
    std::fprintf(stderr, "[serve] no --api-key-file: the API is open to anyone who reaches %s:%d\n",
                 so.host.c_str(), port);
  std::fprintf(stderr, "[serve] listening on http://%s:%d\n", so.host.c_str(), port);
  server.run();
  std::fprintf(stderr, "[serve] stopped\n");
  return 0;
}

const Registrar reg({
    "serve",
    "an OpenAI-compatible server with continuous batching, a chat page and metrics",
    join({engine_flags(),
          {
              Flag::text("--host", "127.0.0.1", "address to listen on (0.0.0.0: every one)",
                         "ADDR"),
              Flag::integer("--port", 8080, 0, 65535, "port to listen on; 0: any free port"),
              Flag::integer("--max-batch", 32, 1, 4096,
                            "sequences decoded together (each sample of a request is one)"),
              Flag::text("--kv-memory", "2GiB",
                         "KV-cache memory (at most a full context per sequence of the batch)",
                         "SIZE"),
              Flag::integer("--step-tokens", 64, 0, 1 << 20,
                            "token rows per engine step while sequences decode (decodes, then "
                            "prompt chunks); default 64 on cpu, 512 on cuda; 0: no limit"),
              Flag::number("--max-step-ratio", 1.5, 0, 1e6,
                           "while sequences decode, prompt rows keep a step within this many "
                           "times the decode rows' cost (learned from the steps); 0: rows only"),
              Flag::integer("--max-queue", 256, 0, 1 << 20,
                            "requests waiting to start; more are answered 429"),
              Flag::number("--max-wait", 120.0, 0, 1e6,
                           "seconds a request may wait to start (then 503); 0: no limit"),
              Flag::number("--request-timeout", 600.0, 0, 1e7,
                           "seconds a request may run (then it ends as at max_tokens); 0: none"),
              Flag::text("--max-body", "1MiB", "largest request body (larger: 413)", "SIZE"),
              Flag::text("--api-key-file", "",
                         "file of API keys, one per line (Authorization: Bearer KEY); none: open",
                         "PATH"),
              Flag::text("--model-name", "", "the model's id in the API; default: the file's stem",
                         "NAME"),
              Flag::toggle("--no-prefix-cache", "do not keep prompt blocks for later requests"),
              Flag::number("--shutdown-grace", 30.0, 0, 3600,
                           "seconds running requests get to finish after SIGTERM"),
              Flag::text("--replica-id", "",
                         "this replica's name in the X-Tessera-Replica header; default host:port",
                         "NAME"),
          }}),
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
