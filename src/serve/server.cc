// The server's setup and its small endpoints: routes, API keys, limits (body, queue), the
// error body of every failed request, /health, /metrics, /v1/models, /v1/embeddings, the page,
// and the graceful shutdown. The generation endpoints are in completions.cc.
#include "serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "infer/embed.h"
#include "serve/api_request.h"
#include "serve/engine_loop.h"
#include "serve/metrics.h"
#include "serve/openai_json.h"
#include "serve/page.h"

namespace tessera::serve {

namespace {

// Constant-time equality: the time does not depend on where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

}  // namespace

Server::Server(const infer::LoadedModel& model, infer::Engine& engine,
               const infer::SchedulerOptions& sched, const ServerOptions& opts)
    : model_(model),
      engine_(engine),
      opts_(opts),
      metrics_(std::make_unique<Metrics>()),
      http_(std::make_unique<httplib::Server>()),
      max_running_(sched.max_running) {
  TS_CHECK(!opts_.model_name.empty(), "[serve] model_name is empty");
  TS_CHECK(opts_.max_queue >= 0, "[serve] max_queue must be >= 0");
  TS_CHECK(opts_.request_timeout_seconds >= 0, "[serve] request_timeout_seconds must be >= 0");
  metrics_->set_memory_bandwidth(opts_.memory_bandwidth);
  loop_ = std::make_unique<EngineLoop>(engine, model.tok, sched, *metrics_);
  // Every connection gets a thread: the running batch and the queue must all be able to wait
  // on their streams at once, with room for /health and /metrics beside them.
  const auto threads = static_cast<size_t>(sched.max_running + opts_.max_queue + 16);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(opts_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(10, 0);
  routes();
}

Server::~Server() {
  if (http_->is_running()) http_->stop();
  loop_.reset();  // joins the engine thread before the engine goes
}

int Server::bind() {
  // cpp-httplib listens with a backlog of 5 (built into Debian's library): 64 clients connecting
  // at once would see refused attempts retried a second later. Its socket-options hook hands us
  // the listening socket; once bound, listen again with the system's maximum.
  int listener = -1;
  http_->set_socket_options([&listener](int fd) {
    httplib::default_socket_options(fd);
    listener = fd;
  });
  const int port = opts_.port == 0
                       ? http_->bind_to_any_port(opts_.host)
                       : (http_->bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  TS_CHECK(port > 0, "[serve] cannot listen on ", opts_.host, ":", opts_.port,
           " (in use, or not an address of this machine)");
  http_->set_socket_options(httplib::default_socket_options);  // the hook held a local
  if (listener >= 0) ::listen(listener, SOMAXCONN);
  opts_.port = port;
  if (opts_.replica.empty()) opts_.replica = opts_.host + ":" + std::to_string(port);
  return port;
}

void Server::run() {
  http_->listen_after_bind();
}

void Server::shutdown(double grace_seconds) {
  draining_ = true;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));
  while (!loop_->idle() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!loop_->idle()) {
    std::fprintf(stderr, "[serve] grace period over: cancelling the requests still running\n");
    loop_->cancel_all();
    for (int i = 0; i < 250 && !loop_->idle(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The streams just ended: let their handlers write the last chunks.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  http_->stop();
}

bool Server::authorized(const httplib::Request& req, httplib::Response& res) {
  if (opts_.api_keys.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  bool ok = false;
  if (auth.compare(0, prefix.size(), prefix) == 0) {
    const std::string key = auth.substr(prefix.size());
    for (const std::string& k : opts_.api_keys) ok |= same_secret(key, k);  // no early exit
  }
  if (!ok) {
    res.set_header("WWW-Authenticate", "Bearer");
    send_json(res, 401,
              error_json(ApiError(401,
                                  auth.empty() ? "no API key: send 'Authorization: Bearer KEY'"
                                               : "the API key is not valid",
                                  "", "authentication_error")));
  }
  return ok;
}

void Server::check_model(const std::string& model) const {
  // "unknown": what SGLang's router sends for a client that named no model.
  if (!model.empty() && model != "unknown" && model != opts_.model_name)
    throw ApiError(
        404,
        "the model '" + model + "' does not exist here; this server has '" + opts_.model_name + "'",
        "model", "not_found_error");
}

void Server::routes() {
  httplib::Server& s = *http_;
  // Every response names the replica that served it (routers and tests read it).
  s.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    res.set_header("X-Tessera-Replica", opts_.replica);
  });
  // Statuses httplib decides itself (404, 413, 400 on a malformed request) get an OpenAI error
  // body like ours.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg =
        res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
        : res.status == 413
            ? "the request body is larger than the limit of " +
                  std::to_string(opts_.max_body_bytes) + " bytes"
            : "the request could not be read (HTTP " + std::to_string(res.status) + ")";
    res.set_content(dump(error_json(ApiError(res.status, msg))), "application/json");
    metrics_->count_request(req.path, res.status);
  });
  s.set_exception_handler([this](const httplib::Request& req, httplib::Response& res,
                                 std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "[serve] %s %s: %s\n", req.method.c_str(), req.path.c_str(), msg.c_str());
    send_json(res, 500, error_json(ApiError(500, msg, "", "server_error")));
    metrics_->count_request(req.path, 500);
  });

  s.Get("/", [this](const httplib::Request& req, httplib::Response& res) {
    res.set_content(std::string(page_html()), "text/html; charset=utf-8");
    metrics_->count_request(req.path, 200);
  });
  s.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    const bool draining = draining_;
    send_json(res, draining ? 503 : 200, {{"status", draining ? "draining" : "ok"}});
    metrics_->count_request(req.path, res.status);
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) {
      const json m = {{"id", opts_.model_name},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "tessera"},
                      {"max_model_len", engine_.options().max_ctx}};
      send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
    }
    metrics_->count_request(req.path, res.status);
  });
  // What SGLang's router asks a worker for (its model's name), under both its names. No model
  // or tokenizer path: given one, the router would try to load a tokenizer itself.
  for (const char* path : {"/server_info", "/get_server_info"})
    s.Get(path, [this](const httplib::Request& req, httplib::Response& res) {
      send_json(res, 200,
                {{"served_model_name", opts_.model_name},
                 {"max_total_num_tokens",
                  engine_.cache().shape().n_blocks * engine_.cache().shape().block_tokens},
                 {"context_length", engine_.options().max_ctx}});
      metrics_->count_request(req.path, 200);
    });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, true);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, false);
  });
  s.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
    handle_embeddings(req, res);
  });
}

void Server::handle_embeddings(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return metrics_->count_request(req.path, res.status);
  try {
    if (draining_) throw ApiError(503, "the server is shutting down", "", "server_error");
    const EmbeddingRequest e = parse_embedding_request(req.body);
    check_model(e.model);
    std::vector<std::vector<int32_t>> inputs = e.token_lists;
    for (const std::string& t : e.texts) inputs.push_back(model_.tok.encode(t));
    const int64_t V = engine_.config().vocab, ctx = engine_.options().max_ctx;
    const int64_t BT = engine_.cache().shape().block_tokens;
    int64_t total = 0;
    for (const std::vector<int32_t>& in : inputs) {
      if (in.empty()) throw ApiError(400, "an input has no tokens", "input");
      if (static_cast<int64_t>(in.size()) > ctx)
        throw ApiError(400,
                       "an input has " + std::to_string(in.size()) +
                           " tokens, more than the context of " + std::to_string(ctx),
                       "input");
      for (int32_t t : in)
        if (t >= V)
          throw ApiError(400, "token id " + std::to_string(t) + " is outside the vocabulary",
                         "input");
      total += static_cast<int64_t>(in.size());
    }
    json data = json::array();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<int32_t>& in = inputs[i];
      const auto blocks =
          static_cast<int64_t>((in.size() + static_cast<size_t>(BT) - 1) / static_cast<size_t>(BT));
      std::vector<float> v = loop_->run<std::vector<float>>([&](infer::Scheduler& sched) {
        if (!sched.reserve_blocks(blocks))
          throw ApiError(503, "the KV cache is busy with running requests; retry", "",
                         "server_error");
        return infer::embed_tokens(sched.engine(), in);
      });
      json item = {{"object", "embedding"}, {"index", i}};
      if (e.base64)
        item["embedding"] = base64(
            std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
      else
        item["embedding"] = v;
      data.push_back(std::move(item));
    }
    send_json(res, 200,
              {{"object", "list"},
               {"data", data},
               {"model", opts_.model_name},
               {"usage", {{"prompt_tokens", total}, {"total_tokens", total}}}});
  } catch (const ApiError& e) {
    if (e.status == 503) res.set_header("Retry-After", "1");
    send_json(res, e.status, error_json(e));
  } catch (const Error& e) {
    send_json(res, 400, error_json(ApiError(400, e.what(), "input")));
  }
  metrics_->count_request(req.path, res.status);
}

}  // namespace tessera::serve
