#include "serve/completion_request.h"

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <utility>

#include "serve/json_body.h"

namespace lockstep {

namespace {

using nlohmann::json;

}  // namespace

std::uint64_t DrawSeed() {
  std::random_device rd;
  const std::uint64_t bits = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return bits & ((std::uint64_t{1} << 53) - 1);  // a JavaScript number holds it exactly
}

namespace {

ApiError TypeError(const std::string& field, const char* want) {
  return ApiError::BadRequest("'" + field + "' must be " + want, field, "invalid_type");
}

ApiError RangeError(const std::string& field, const std::string& want) {
  return ApiError::BadRequest("'" + field + "' must be " + want, field, "out_of_range");
}

// An integer field within [lo, hi] (a JSON integer: 16.0 and "16" are refused).
std::optional<ApiError> GetInt(const json& v, const std::string& field, std::int64_t lo,
                               std::int64_t hi, int& out) {
  if (!v.is_number_integer()) return TypeError(field, "an integer");
  // Unsigned first: 2^64 - 1 is no int64, and nlohmann stores every non-negative integer as one.
  const bool in_range = v.is_number_unsigned()
                            ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
                                  static_cast<std::int64_t>(v.get<std::uint64_t>()) >= lo
                            : v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
  if (!in_range)
    return RangeError(field, "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = static_cast<int>(v.get<std::int64_t>());
  return std::nullopt;
}

std::optional<ApiError> GetNumber(const json& v, const std::string& field, double lo, double hi,
                                  bool lo_open, double& out) {
  if (!v.is_number()) return TypeError(field, "a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo))
    return RangeError(field, std::string(lo_open ? "in (" : "in [") + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "]");
  out = x;
  return std::nullopt;
}

std::optional<ApiError> GetBool(const json& v, const std::string& field, bool& out) {
  if (!v.is_boolean()) return TypeError(field, "true or false");
  out = v.get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const json& v, const CompletionLimits& lim,
                                    CompletionRequest& r) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s.empty()) return RangeError("prompt", "a non-empty string");
    if (s.size() > lim.max_prompt_bytes)
      return RangeError("prompt", "at most " + std::to_string(lim.max_prompt_bytes) + " bytes");
    r.prompt_text = s;
    return std::nullopt;
  }
  if (!v.is_array() || v.empty())
    return TypeError("prompt", "a non-empty string or a non-empty array of token ids");
  if (v.size() > static_cast<std::size_t>(lim.max_context))
    return ApiError::BadRequest("prompt of " + std::to_string(v.size()) +
                                    " tokens is longer than the context (" +
                                    std::to_string(lim.max_context) + ")",
                                "prompt", "context_length_exceeded");
  r.prompt_ids.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& id = v[i];
    if (id.is_string()) return TypeError("prompt", "one string or an array of token ids (n = 1)");
    if (!id.is_number_integer()) return TypeError("prompt", "an array of integer token ids");
    const bool neg = !id.is_number_unsigned() && id.get<std::int64_t>() < 0;
    if (neg || id.get<std::uint64_t>() >= static_cast<std::uint64_t>(lim.n_vocab))
      return ApiError::BadRequest("prompt[" + std::to_string(i) +
                                      "] is outside the vocabulary [0, " +
                                      std::to_string(lim.n_vocab) + ")",
                                  "prompt", "invalid_token");
    r.prompt_ids.push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStop(const json& v, CompletionRequest& r) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().empty()) return RangeError("stop", "non-empty strings");
    r.stop.push_back(v.get<std::string>());
    return std::nullopt;
  }
  if (!v.is_array()) return TypeError("stop", "a string or an array of strings");
  if (v.size() > 4) return RangeError("stop", "at most 4 strings");
  for (const json& s : v) {
    if (!s.is_string()) return TypeError("stop", "a string or an array of strings");
    const auto& t = s.get_ref<const std::string&>();
    if (t.empty() || t.size() > 256) return RangeError("stop", "strings of 1 to 256 bytes");
    r.stop.push_back(t);
  }
  return std::nullopt;
}

// An arm name goes into the export and logs: a short plain name only.
bool PlainName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  return true;
}

std::optional<ApiError> ParseExport(const json& v, CompletionRequest& r) {
  if (v.is_boolean()) {
    if (v.get<bool>()) r.export_request = ExportRequest{};
    return std::nullopt;
  }
  if (!v.is_object()) return TypeError("lockstep.export", "true, false or {windows, points}");
  ExportRequest e;
  for (const auto& [key, val] : v.items()) {
    const std::string field = "lockstep.export." + key;
    if (key != "windows" && key != "points")
      return ApiError::BadRequest("unknown field '" + field + "'", field, "unknown_field");
    if (!val.is_string() || val.get_ref<const std::string&>().size() > 256)
      return TypeError(field, "a string of at most 256 bytes");
    (key == "windows" ? e.windows : e.points) = val.get<std::string>();
  }
  r.export_request = std::move(e);
  return std::nullopt;
}

std::optional<ApiError> ParseLockstep(const json& v, CompletionRequest& r) {
  if (!v.is_object())
    return TypeError("lockstep", "an object {arm, export, trace, cache, keep, priority}");
  for (const auto& [key, val] : v.items()) {
    const std::string field = "lockstep." + key;
    if (key == "arm") {
      if (!val.is_string() || !PlainName(val.get<std::string>()))
        return TypeError(field, "a name of 1 to 64 letters, digits, '-', '_' or '.'");
      r.arm = val.get<std::string>();
    } else if (key == "export") {
      if (auto e = ParseExport(val, r)) return e;
    } else if (key == "trace") {
      if (auto e = GetBool(val, field, r.trace)) return e;
    } else if (key == "keep") {
      if (auto e = GetBool(val, field, r.keep)) return e;
    } else if (key == "priority") {
      if (auto e = GetInt(val, field, -1000, 1000, r.priority)) return e;
    } else if (key == "cache") {
      if (!val.is_string() || (val != "use" && val != "bypass"))
        return TypeError(field, "\"use\" or \"bypass\"");
      r.cache_bypass = val == "bypass";
    } else {
      return ApiError::BadRequest("unknown field '" + field + "'", field, "unknown_field");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseSeed(const json& v, CompletionRequest& r) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) return TypeError("seed", "an integer");
  if (!v.is_number_unsigned() && v.get<std::int64_t>() < 0)
    return RangeError("seed", "a non-negative integer (64 bits)");
  r.seed = v.get<std::uint64_t>();
  r.seed_given = true;
  return std::nullopt;
}

// One top-level field into `r`; an unknown name is refused by name.
std::optional<ApiError> ParseField(const std::string& key, const json& v,
                                   const CompletionLimits& lim, CompletionRequest& r) {
  if (key == "model") {
    if (!v.is_string()) return TypeError(key, "a string");
    r.model = v.get<std::string>();
    if (!lim.model_name.empty() && r.model != lim.model_name)
      return ApiError::NotFound("the model '" + r.model + "' is not served here (GET /v1/models)",
                                "model_not_found");
    return std::nullopt;
  }
  if (key == "prompt") return ParsePrompt(v, lim, r);
  if (key == "max_tokens") return GetInt(v, key, 1, lim.max_context, r.max_tokens);
  if (key == "temperature") return GetNumber(v, key, 0.0, 2.0, false, r.temperature);
  if (key == "top_p") return GetNumber(v, key, 0.0, 1.0, true, r.top_p);
  if (key == "top_k") return GetInt(v, key, 0, lim.n_vocab, r.top_k);
  if (key == "seed") return ParseSeed(v, r);
  if (key == "stop") return ParseStop(v, r);
  if (key == "stream") return GetBool(v, key, r.stream);
  if (key == "id_slot") return GetInt(v, key, -1, 1 << 16, r.id_slot);
  if (key == "ignore_eos") return GetBool(v, key, r.ignore_eos);
  if (key == "lockstep") return ParseLockstep(v, r);
  if (key == "n") return GetInt(v, key, 1, 16, r.n);
  if (key == "stream_options") {
    if (v.is_null()) return std::nullopt;
    if (!v.is_object()) return TypeError(key, "an object {include_usage}");
    for (const auto& [k, x] : v.items()) {
      if (k != "include_usage")
        return ApiError::BadRequest("unknown field 'stream_options." + k + "'",
                                    "stream_options." + k, "unknown_field");
      if (auto e = GetBool(x, "stream_options.include_usage", r.include_usage)) return e;
    }
    return std::nullopt;
  }
  if (key == "user") {  // an end-user id for abuse tracking: nothing to do with it here
    if (!v.is_string()) return TypeError(key, "a string");
    r.user_given = true;
    return std::nullopt;
  }
  if (key == "echo") {
    bool echo = false;
    if (auto e = GetBool(v, key, echo)) return e;
    if (echo)
      return ApiError::BadRequest(
          "'echo' is not supported: the answer holds the generated text "
          "only (the prompt is the request's own)",
          key, "unsupported_field");
    return std::nullopt;
  }
  if (key == "best_of") {
    int best_of = 1;
    if (auto e = GetInt(v, key, 1, 1 << 20, best_of)) return e;
    if (best_of != 1)
      return ApiError::BadRequest(
          "'best_of' > 1 is not supported: ranking candidates by their "
          "log probability is not implemented (use n and logprobs)",
          key, "unsupported_field");
    return std::nullopt;
  }
  if (key == "presence_penalty") return GetNumber(v, key, -2.0, 2.0, false, r.presence_penalty);
  if (key == "frequency_penalty") return GetNumber(v, key, -2.0, 2.0, false, r.frequency_penalty);
  if (key == "repeat_penalty") return GetNumber(v, key, 0.0, 10.0, true, r.repeat_penalty);
  if (key == "repeat_last_n") return GetInt(v, key, -1, 1 << 30, r.repeat_last_n);
  if (key == "logprobs") {
    if (v.is_null()) return std::nullopt;
    return GetInt(v, key, 0, 5, r.logprobs);
  }
  return ApiError::BadRequest("unknown field '" + key + "'", key, "unknown_field");
}

}  // namespace

std::optional<ApiError> CheckContext(std::size_t n_prompt, int max_tokens,
                                     const CompletionLimits& limits) {
  if (n_prompt + static_cast<std::size_t>(max_tokens) <=
      static_cast<std::size_t>(limits.max_context))
    return std::nullopt;
  return ApiError::BadRequest("prompt of " + std::to_string(n_prompt) + " tokens + max_tokens " +
                                  std::to_string(max_tokens) + " is longer than the context (" +
                                  std::to_string(limits.max_context) + ")",
                              "prompt", "context_length_exceeded");
}

std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body,
                                                                 const CompletionLimits& limits) {
  auto parsed = ParseJsonObjectBody<json>(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  CompletionRequest r;
  for (const auto& [key, v] : j.items())
    if (auto e = ParseField(key, v, limits, r)) return *e;
  if (!r.prompt_text && r.prompt_ids.empty())
    return ApiError::BadRequest("'prompt' is required", "prompt", "missing_field");
  if (!r.prompt_text)
    if (auto e = CheckContext(r.prompt_ids.size(), r.max_tokens, limits)) return *e;
  return r;
}

}  // namespace lockstep
