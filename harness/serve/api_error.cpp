#include "serve/api_error.h"

#include <nlohmann/json.hpp>
#include <utility>

namespace lockstep {

std::string ApiError::Body() const {
  nlohmann::json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  // Messages may quote client bytes (a field name): invalid UTF-8 is replaced, never thrown.
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false,
                                           nlohmann::json::error_handler_t::replace);
}

ApiError ApiError::BadRequest(std::string message, std::string param, std::string code) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}
ApiError ApiError::Unauthorized() {
  return {401, "a valid API key is required (Authorization: Bearer KEY)", "authentication_error",
          "", "invalid_api_key"};
}
ApiError ApiError::NotFound(std::string message, std::string code) {
  return {404, std::move(message), "invalid_request_error", "", std::move(code)};
}
ApiError ApiError::TooLarge(std::string message) {
  return {413, std::move(message), "invalid_request_error", "", "payload_too_large"};
}
ApiError ApiError::QueueFull(std::string message) {
  return {429, std::move(message), "rate_limit_error", "", "queue_full"};
}
ApiError ApiError::Unavailable(std::string message, std::string code) {
  return {503, std::move(message), "unavailable_error", "", std::move(code)};
}
ApiError ApiError::NotImplemented(std::string message) {
  return {501, std::move(message), "invalid_request_error", "", "not_implemented"};
}
ApiError ApiError::Internal(std::string message) {
  return {500, std::move(message), "server_error", "", "internal_error"};
}

ApiError ApiError::FromSubmit(SubmitError why, std::string message) {
  switch (why) {
    case SubmitError::kInvalid:
      return BadRequest(std::move(message));
    case SubmitError::kQueueFull:
      return QueueFull(std::move(message));
    case SubmitError::kNone:
    case SubmitError::kOther:
      break;
  }
  return Internal(std::move(message));
}

}  // namespace lockstep
