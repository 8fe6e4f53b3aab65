// The OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions (streamed as
// server-sent events or whole), /v1/embeddings, /v1/models, /health, /metrics and the web page
// at /, over one engine loop. It binds where it is told (127.0.0.1 unless told otherwise),
// checks API keys in constant time, bounds the body, the queue and each request's time, cancels
// the work of a client that leaves, and shuts down gracefully.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "infer/loaded_model.h"
#include "infer/scheduler.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tessera::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (bind() says which)
  std::string model_name;                // the id clients name in "model"
  std::vector<std::string> api_keys;     // empty: no key asked
  int64_t max_queue = 256;               // requests waiting to start; more get 429
  size_t max_body_bytes = 1 << 20;       // larger bodies get 413
  double request_timeout_seconds = 600;  // a request running longer ends ("length")
  double memory_bandwidth = 0;           // bytes/s the machine measured (the page's roof)
  std::string replica;                   // X-Tessera-Replica; empty: host:port
};

class EngineLoop;
class Metrics;

class Server {
 public:
  // `model` (its tokenizer and chat template) and `engine` (built from it) must outlive this.
  Server(const infer::LoadedModel& model, infer::Engine& engine,
         const infer::SchedulerOptions& sched, const ServerOptions& opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (throws naming them when it cannot) and returns the port.
  int bind();
  // Serves until shutdown() has run; call after bind().
  void run();
  // From any thread: answers new work with 503 and /health with "draining", lets the requests
  // in flight finish for up to grace_seconds, cancels the rest, then stops listening (run()
  // returns).
  void shutdown(double grace_seconds);

 private:
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res);
  void handle_generation(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_embeddings(const httplib::Request& req, httplib::Response& res);
  void check_model(const std::string& model) const;

  const infer::LoadedModel& model_;
  infer::Engine& engine_;
  ServerOptions opts_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> draining_{false};
  int64_t max_running_;
};

}  // namespace tessera::serve
