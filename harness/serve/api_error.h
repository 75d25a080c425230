// ApiError: an HTTP error in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
// with the status it is sent with. Every refusal of `lockstep serve` is one of these, built by the
// named factories below so a status always comes with the same type.
#pragma once

#include <string>

#include "lockstep/engine/scheduler.h"

namespace lockstep {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault; "" = null
  std::string code;   // a short machine name ("unknown_field"); "" = null

  // The JSON body (one line, no trailing newline).
  std::string Body() const;

  static ApiError BadRequest(std::string message, std::string param = {},
                             std::string code = "invalid_value");
  static ApiError Unauthorized();
  static ApiError NotFound(std::string message, std::string code = "not_found");
  static ApiError TooLarge(std::string message);
  static ApiError QueueFull(std::string message);
  static ApiError Unavailable(std::string message, std::string code);
  static ApiError NotImplemented(std::string message);
  static ApiError Internal(std::string message);
  // The scheduler's refusal of a submission, by its type: kInvalid 400, kQueueFull 429,
  // anything else 500.
  static ApiError FromSubmit(SubmitError why, std::string message);
};

}  // namespace lockstep
