// Generation to completion: requests added to a scheduler, stepped until done, text and results
// collected per sample.
#include "infer/generate.h"

#include "core/error.h"

namespace tessera::infer {

namespace {

// Adds every request to `sched` with sinks that write into `out` (first[i] is request i's first
// sample's index there), runs it to the end and returns the results.
std::vector<GenerateResult> run_all(Scheduler& sched, const std::vector<GenerateRequest>& reqs,
                                    const BatchTextCallback& on_text) {
  std::vector<GenerateResult> out;
  std::vector<size_t> first;
  for (const GenerateRequest& r : reqs) {
    first.push_back(out.size());
    out.resize(out.size() + static_cast<size_t>(std::max<int64_t>(r.n, 1)));
  }
  std::vector<Scheduler::RequestId> ids;
  try {
    for (size_t i = 0; i < reqs.size(); ++i) {
      RequestSink sink;
      const size_t base = first[i];
      if (on_text)
        sink.on_tokens = [&on_text, base](size_t k, std::span<const GeneratedToken>,
                                          std::string_view text) {
          return text.empty() || on_text(base + k, text);
        };
      sink.on_finish = [&out, base](size_t k, GenerateResult&& r) { out[base + k] = std::move(r); };
      ids.push_back(sched.add(reqs[i], std::move(sink)));
    }
    sched.run_until_idle();
  } catch (...) {
    for (Scheduler::RequestId id : ids) sched.cancel(id);
    throw;
  }
  return out;
}

}  // namespace

GenerateResult generate(Scheduler& sched, const GenerateRequest& req, const TextCallback& on_text) {
  BatchTextCallback cb;
  if (on_text) cb = [&](size_t k, std::string_view t) { return k != 0 || on_text(t); };
  return std::move(run_all(sched, {req}, cb)[0]);
}

GenerateResult generate(Engine& engine, const tokenizer::Tokenizer& tok, const GenerateRequest& req,
                        const TextCallback& on_text) {
  SchedulerOptions o;
  o.max_running = std::max<int64_t>(req.n, 1);
  o.prefix_cache = false;
  Scheduler sched(engine, tok, o);
  return generate(sched, req, on_text);
}

std::vector<GenerateResult> generate_batch(Engine& engine, const tokenizer::Tokenizer& tok,
                                           const std::vector<GenerateRequest>& reqs,
                                           const BatchTextCallback& on_text) {
  SchedulerOptions o;
  o.max_running = 0;
  for (const GenerateRequest& r : reqs) o.max_running += std::max<int64_t>(r.n, 1);
  o.max_running = std::max<int64_t>(o.max_running, 1);
  o.prefix_cache = false;
  Scheduler sched(engine, tok, o);
  return run_all(sched, reqs, on_text);
}

}  // namespace tessera::infer
