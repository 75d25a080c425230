#include "serve/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>

#include "serve/auth.h"
#include "serve/chat_handler.h"
#include "serve/completion_response.h"
#include "serve/completions_handler.h"
#include "serve/lockstep_endpoints.h"
#include "serve/slot_actions.h"

namespace lockstep {

namespace {

// True on a handler thread whose connection was accepted over max_connections.
thread_local bool t_overloaded = false;
// True between a handler's own count of its answer and the log line.
thread_local bool t_counted = false;
// When routing began (monotonic ns): a body read that failed after --read-timeout is a 408.
thread_local std::int64_t t_routing_ns = 0;

std::int64_t MonoNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A known endpoint: its name in the metrics and the methods it answers.
struct Route {
  std::string endpoint;
  std::string allow;
};

std::optional<Route> FindRoute(const std::string& path) {
  static const std::pair<const char*, const char*> kExact[] = {
      {"/health", "GET"},          {"/v1/models", "GET"},
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
      {"/slots", "GET"},           {"/metrics", "GET"},
      {"/v1/lockstep/info", "GET"}};
  for (const auto& [p, allow] : kExact)
    if (path == p) return Route{p, allow};
  const std::string slots = "/slots/", exports = "/v1/exports/";
  if (path.size() > slots.size() && path.rfind(slots, 0) == 0 &&
      path.find_first_not_of("0123456789", slots.size()) == std::string::npos)
    return Route{"/slots/{id}", "POST"};
  if (path.size() > exports.size() && path.rfind(exports, 0) == 0 &&
      path.find('/', exports.size()) == std::string::npos)
    return Route{"/v1/exports/{file}", "GET"};
  return std::nullopt;
}

bool Allowed(const Route& r, const std::string& method) {
  return method == r.allow || (method == "HEAD" && r.allow == "GET");
}

// --cors: the origin header for this request ("" when the origin is not the allowed one).
std::string CorsOrigin(const ServeOptions& o, const httplib::Request& req) {
  if (o.cors_origin.empty()) return "";
  if (o.cors_origin == "*") return "*";
  return req.get_header_value("Origin") == o.cors_origin ? o.cors_origin : "";
}

// httplib's thread pool with a count of the connections waiting or served: one accepted beyond
// `max` is still handed a thread (httplib owns its socket) but answered 503 and closed at once.
class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(std::size_t threads, int max) : pool_(threads), max_(max) {}
  void enqueue(std::function<void()> fn) override {
    const bool over = ++held_ > max_;
    pool_.enqueue([this, over, fn = std::move(fn)] {
      t_overloaded = over;
      fn();
      --held_;
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  std::atomic<int> held_{0};
  const int max_;
};

// A path as the log prints it: printable ASCII only, at most 128 bytes.
std::string LogPath(const std::string& path) {
  std::string out;
  for (char c : path.substr(0, 128)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

bool Loopback(const std::string& addr) {
  return addr == "127.0.0.1" || addr == "::1" || addr.rfind("::ffff:127.", 0) == 0;
}

void HandleHealth(const ServeContext& ctx, httplib::Response& res) {
  const char* status = ctx.draining ? "draining" : !ctx.ready ? "loading" : "ok";
  if (!ctx.ready || ctx.draining) res.status = 503;
  res.set_content(Dump({{"status", status}, {"engine_instance", ctx.engine_instance}}),
                  "application/json");
}

void HandleModels(const ServeContext& ctx, httplib::Response& res) {
  nlohmann::json m = {{"id", ctx.limits.model_name},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "lockstep"},
                      {"n_vocab", ctx.limits.n_vocab},
                      {"max_context", ctx.limits.max_context}};
  res.set_content(Dump(nlohmann::json{{"object", "list"}, {"data", {m}}}), "application/json");
}

// Fills an error body for statuses httplib set itself (404 without a route, 413, 400 on a
// malformed request line or a body that did not arrive: 408 when that took --read-timeout) and
// for handlers that set a status alone.
void FillErrorBody(const ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  if (!res.body.empty()) return;
  if (res.status == 400 && req.method == "POST" && t_routing_ns > 0 &&
      MonoNs() - t_routing_ns >=
          std::int64_t{ctx.opts.read_timeout_s} * 1'000'000'000 - 250'000'000) {
    res.set_header("Connection", "close");
    ApiError e = ApiError::BadRequest("the request body did not arrive within --read-timeout (" +
                                          std::to_string(ctx.opts.read_timeout_s) + " s)",
                                      "", "request_timeout");
    e.status = 408;
    return SendError(res, e);
  }
  ApiError e;
  switch (res.status) {
    case 404:
      e = ApiError::NotFound("no endpoint " + req.method + " " + req.path);
      break;
    case 413:
      e = ApiError::TooLarge("the request body is larger than --max-body");
      break;
    case 405:
      e = ApiError::NotFound("method not allowed", "method_not_allowed");
      e.status = 405;
      break;
    default:
      e = ApiError::BadRequest("malformed HTTP request", "", "bad_http");
      e.status = res.status;
  }
  SendError(res, e);
}

}  // namespace

HttpServer::HttpServer(ServeContext& ctx) : ctx_(ctx), svr_(std::make_unique<httplib::Server>()) {
  const ServeOptions& o = ctx_.opts;
  const auto threads = static_cast<std::size_t>(o.http_threads);
  const int max_conn = o.max_connections;
  svr_->new_task_queue = [threads, max_conn] { return new BoundedTaskQueue(threads, max_conn); };
  svr_->set_payload_max_length(o.max_body);
  svr_->set_read_timeout(o.read_timeout_s, 0);
  svr_->set_write_timeout(o.write_timeout_s, 0);
  svr_->set_keep_alive_timeout(o.keep_alive_s);
  svr_->set_keep_alive_max_count(static_cast<std::size_t>(o.keep_alive_max));
  // The listening socket, to widen its accept backlog once bound (Bind).
  svr_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  Routes();
}

HttpServer::~HttpServer() { Stop(); }

Result<int> HttpServer::Bind() {
  const ServeOptions& o = ctx_.opts;
  const int port = o.port == 0 ? svr_->bind_to_any_port(o.host)
                               : (svr_->bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0)
    return Status::InvalidArgument("--host/--port", "cannot listen on " + o.host + ":" +
                                                        std::to_string(o.port) +
                                                        " (in use, or not an address here)");
  // cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
  // library): a burst of more simultaneous connects than that, while the accept thread waits for
  // a core, had SYNs dropped (the kernel's ListenOverflows), each costing the client a 1 s, 3 s,
  // 7 s retransmit, and a client with a 5 s connect timeout failed after three drops: the rare
  // request without an answer. Listening again on the bound socket sets the backlog to
  // --max-connections (the kernel caps it at net.core.somaxconn).
  if (listen_fd_ >= 0 && ::listen(listen_fd_, std::max(o.max_connections, 16)) != 0)
    return Status::Runtime("--max-connections",
                           std::string("cannot set the listen backlog: ") + std::strerror(errno));
  return port;
}

void HttpServer::Start() {
  listen_ = std::thread([this] { svr_->listen_after_bind(); });
}

void HttpServer::Stop() {
  if (!listen_.joinable()) return;
  // httplib's stop() does nothing before the listen thread's loop runs (a refused engine config
  // returns right after Start()): wait for it (bounded), or accept() would block forever.
  for (int i = 0; i < 2000 && !svr_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  svr_->stop();
  listen_.join();
}

void HttpServer::Routes() {
  ServeContext& ctx = ctx_;
  svr_->set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    t_routing_ns = MonoNs();
    using HR = httplib::Server::HandlerResponse;
    if (t_overloaded) {
      res.set_header("Connection", "close");
      res.set_header("Retry-After", "1");
      SendError(res, ApiError::Unavailable("too many connections", "too_many_connections"));
      return HR::Handled;
    }
    const std::optional<Route> route = FindRoute(req.path);
    const std::string origin = CorsOrigin(ctx.opts, req);
    if (!origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", origin);
      if (origin != "*") res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Expose-Headers",
                     "X-Request-Id, X-Lockstep-Sha256, Retry-After");
    }
    if (req.method == "OPTIONS" && route && !ctx.opts.cors_origin.empty()) {  // CORS preflight
      res.status = 204;
      res.set_header("Allow", route->allow + ", OPTIONS");
      if (!origin.empty()) {
        res.set_header("Access-Control-Allow-Methods", route->allow + ", OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
      }
      return HR::Handled;
    }
    if (route && !Allowed(*route, req.method)) {
      res.set_header("Allow", route->allow + (ctx.opts.cors_origin.empty() ? "" : ", OPTIONS"));
      ApiError e = ApiError::BadRequest(req.method.substr(0, 16) + " is not allowed on " +
                                            route->endpoint + " (Allow: " + route->allow + ")",
                                        "", "method_not_allowed");
      e.status = 405;
      SendError(res, e);
      return HR::Handled;
    }
    if (req.path != "/health" &&
        !BearerAllowed(req.get_header_value("Authorization"), ctx.opts.api_key)) {
      SendError(res, ApiError::Unauthorized());
      return HR::Handled;
    }
    // A POST without Content-Length (and not chunked) would be read until the client closes:
    // answered at once instead, as is an empty completion body.
    const bool chunked =
        req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos;
    const std::string length = req.get_header_value("Content-Length");
    const bool json_endpoint = route && route->allow == "POST" && route->endpoint != "/slots/{id}";
    if (req.method == "POST" && !chunked && (length.empty() || (length == "0" && json_endpoint))) {
      res.set_header("Connection", "close");
      SendError(res, ApiError::BadRequest(length.empty() ? "a POST needs a body with Content-Length"
                                                         : "the request body is empty (a JSON "
                                                           "object is needed)",
                                          "", "empty_body"));
      return HR::Handled;
    }
    return HR::Unhandled;
  });
  svr_->Get("/health",
            [&ctx](const httplib::Request&, httplib::Response& res) { HandleHealth(ctx, res); });
  svr_->Get("/v1/models",
            [&ctx](const httplib::Request&, httplib::Response& res) { HandleModels(ctx, res); });
  svr_->Post("/v1/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(ctx, req, res);
    // Before httplib writes it (/metrics never lags); httplib turns an unset status (-1) into 200.
    ctx.metrics.CountResponse("/v1/completions", res.status == -1 ? 200 : res.status);
    t_counted = true;
  });
  svr_->Post("/v1/chat/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleChatCompletion(ctx, req, res);
    ctx.metrics.CountResponse("/v1/chat/completions", res.status == -1 ? 200 : res.status);
    t_counted = true;
  });
  svr_->Get("/slots", [&ctx](const httplib::Request&, httplib::Response& res) {
    if (!ctx.ready) return SendError(res, ApiError::Unavailable("loading the model", "loading"));
    res.set_content(Dump(ctx.driver->Slots()), "application/json");
  });
  svr_->Post(R"(/slots/(\d+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleSlotAction(ctx, req, res);
  });
  svr_->Get(R"(/v1/exports/([^/]+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleExportDownload(ctx, req, res);
  });
  svr_->Get("/v1/lockstep/info",
            [&ctx](const httplib::Request&, httplib::Response& res) { HandleInfo(ctx, res); });
  svr_->Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    ServeGauges g;
    if (ctx.ready) g = ctx.driver->Gauges();
    g.draining = ctx.draining;
    res.set_content(ctx.metrics.Text(g), "text/plain; version=0.0.4");
  });
  svr_->set_error_handler(httplib::Server::HandlerWithResponse(
      [&ctx](const httplib::Request& req, httplib::Response& res) {
        FillErrorBody(ctx, req, res);
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, ApiError::Internal("internal error (a bug): see the server log"));
      });
  svr_->set_logger([&ctx](const httplib::Request& req, const httplib::Response& res) {
    // Every response is counted: those a handler counted itself (before the client could read
    // them) not again; the rest (refusals before a handler, other endpoints) here.
    if (!t_counted) {
      const std::optional<Route> route = FindRoute(req.path);
      ctx.metrics.CountResponse(route ? route->endpoint : "other", res.status);
    }
    t_counted = false;
    t_routing_ns = 0;
    // Method, path, status and request id only: never a body, a header value or a query.
    std::fprintf(stderr, "serve: %s %s %d %s%s\n", LogPath(req.method).c_str(),
                 LogPath(req.path).c_str(), res.status,
                 res.get_header_value("X-Request-Id").c_str(),
                 Loopback(req.remote_addr) ? "" : " (remote)");
  });
}

}  // namespace lockstep
