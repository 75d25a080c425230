#include "serve/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

// True between a handler's own count of its answer and the log line.
thread_local bool t_counted = false;

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

// A path as the log prints it: printable ASCII only, at most 128 bytes.
std::string LogPath(const std::string& path) {
  std::string out;
  for (char c : path.substr(0, 128)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

// Decided by the front on the parsed peer address (http_front.h).
bool Loopback(const httplib::Request& req) {
  return req.get_header_value("X-Lockstep-Loopback") == "1";
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
// malformed request) and for handlers that set a status alone. (Slow heads and bodies are the
// front's 408.)
void FillErrorBody(const httplib::Request& req, httplib::Response& res) {
  if (!res.body.empty()) return;
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
  // The front relays at most --http-threads requests at once, each on a connection of its own
  // (Connection: close); two more threads cover a connection still closing.
  const auto threads = static_cast<std::size_t>(o.http_threads) + 2;
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_payload_max_length(o.max_body);
  svr_->set_read_timeout(o.read_timeout_s, 0);
  svr_->set_write_timeout(o.write_timeout_s, 0);
  Routes();
}

HttpServer::~HttpServer() { Stop(); }

Result<int> HttpServer::Bind() {
  const ServeOptions& o = ctx_.opts;
  LOCKSTEP_ASSIGN_OR_RETURN(token_, NewEngineInstance());
  const int backend = svr_->bind_to_any_port("127.0.0.1");
  if (backend < 0) return Status::Runtime("serve", "cannot listen on a loopback port");
  FrontLimits lim;
  lim.max_body = o.max_body;
  lim.max_connections = o.max_connections;
  lim.workers = o.http_threads;
  lim.read_timeout_s = o.read_timeout_s;
  lim.write_timeout_s = o.write_timeout_s;
  lim.keep_alive_s = o.keep_alive_s;
  lim.keep_alive_max = o.keep_alive_max;
  lim.api_key = o.api_key;
  ServeContext& ctx = ctx_;
  front_ = std::make_unique<HttpFront>(
      lim, backend, token_,
      [&ctx](const std::string& method, const std::string& path, int status, bool loopback) {
        const std::optional<Route> route = FindRoute(path);
        ctx.metrics.CountResponse(route ? route->endpoint : "other", status);
        std::fprintf(stderr, "serve: %s %s %d (refused by the front)%s\n",
                     method.empty() ? "-" : LogPath(method).c_str(),
                     path.empty() ? "-" : LogPath(path).c_str(), status,
                     loopback ? "" : " (remote)");
      });
  return front_->Bind(o.host, o.port);
}

void HttpServer::Start() {
  listen_ = std::thread([this] { svr_->listen_after_bind(); });
  front_->Start();
}

void HttpServer::Stop(std::chrono::milliseconds grace) {
  if (!listen_.joinable()) return;
  front_->Stop(grace);
  // httplib's stop() does nothing before the listen thread's loop runs (a refused engine config
  // returns right after Start()): wait for it (bounded), or accept() would block forever.
  for (int i = 0; i < 2000 && !svr_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  svr_->stop();
  listen_.join();
}

void HttpServer::Routes() {
  ServeContext& ctx = ctx_;
  const std::string& token = token_;
  svr_->set_pre_routing_handler([&ctx, &token](const httplib::Request& req,
                                               httplib::Response& res) {
    using HR = httplib::Server::HandlerResponse;
    // Only the front's relays: a request to the internal port from anyone else is refused.
    if (!ConstantTimeEqual(req.get_header_value("X-Lockstep-Front"), token)) {
      res.set_header("Connection", "close");
      SendError(res, ApiError::NotFound("not the server's public port", "not_found"));
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
  svr_->set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        FillErrorBody(req, res);
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
    // Method, path, status and request id only: never a body, a header value or a query.
    std::fprintf(stderr, "serve: %s %s %d %s%s\n", LogPath(req.method).c_str(),
                 LogPath(req.path).c_str(), res.status,
                 res.get_header_value("X-Request-Id").c_str(), Loopback(req) ? "" : " (remote)");
  });
}

}  // namespace lockstep
