// PlanParser's typed value readers (plan_parser.h): a TOML node of the wanted type and range, or
// kInvalidArgument at its file:line:column naming the key, what was wanted and what was found.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "campaign/plan_parser.h"
#include "lockstep/harness/llama_arm.h"

namespace lockstep::plan_internal {

namespace fs = std::filesystem;

std::string Join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (const std::string& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool ValidName(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '.' || ch == '-';
  });
}

std::string TypeName(const toml::node& n) {
  std::ostringstream os;
  os << n.type();  // "string", "integer", "floating-point", "boolean", "table", "array",
                   // "date-time", ...
  return os.str();
}

const nlohmann::json& EngineDefaults() {
  static const nlohmann::json kDefaults = nlohmann::json::parse(EngineConfig{}.ToJson());
  return kDefaults;
}

std::string EngineKeyList() {
  std::vector<std::string> keys;
  for (auto it = EngineDefaults().begin(); it != EngineDefaults().end(); ++it)
    if (it.key() != "model" && it.key() != "replay_path") keys.push_back(it.key());
  for (auto it = LlamaPlanDefaults().begin(); it != LlamaPlanDefaults().end(); ++it)
    keys.push_back(it.key());  // llama.cpp arms (llama_arm.h)
  return Join(keys);
}

Status PlanParser::CheckKeys(const toml::table& t, std::string_view where,
                             const std::vector<std::string>& allowed) const {
  for (auto&& [key, node] : t) {
    if (!Contains(allowed, std::string(key.str())))
      return Error(key.source(), "unknown key '" + std::string(key.str()) + "' " +
                                     std::string(where) + " (expected one of: " + Join(allowed) +
                                     ")");
  }
  return Status::Ok();
}

Result<const toml::table*> PlanParser::Table(const toml::node& n, std::string_view key) const {
  const toml::table* t = n.as_table();
  if (t == nullptr) return TypeError(n, key, "a table");
  return t;
}

Result<const toml::table*> PlanParser::OptTable(const toml::table& t, std::string_view key,
                                                std::string_view where,
                                                const std::vector<std::string>& allowed) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) return static_cast<const toml::table*>(nullptr);
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* sub, Table(*n, key));
  LOCKSTEP_RETURN_IF_ERROR(CheckKeys(*sub, "in " + std::string(where), allowed));
  return sub;
}

Result<std::string> PlanParser::String(const toml::node& n, std::string_view key,
                                       bool allow_empty) const {
  const toml::value<std::string>* v = n.as_string();
  if (v == nullptr) return TypeError(n, key, "a string");
  if (!allow_empty && v->get().empty())
    return Error(n.source(), "'" + std::string(key) + "' must not be empty");
  return v->get();
}

Result<std::string> PlanParser::Name(const toml::node& n, std::string_view key) const {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string s, String(n, key));
  if (!ValidName(s))
    return Error(n.source(),
                 "'" + std::string(key) + "' must match [A-Za-z0-9_.-]+, got '" + s + "'");
  return s;
}

Result<std::int64_t> PlanParser::Integer(const toml::node& n, std::string_view key, std::int64_t lo,
                                         std::int64_t hi) const {
  const toml::value<std::int64_t>* v = n.as_integer();
  if (v == nullptr) return TypeError(n, key, "an integer");
  const std::int64_t x = v->get();
  if (x < lo || x > hi) {
    std::string range = hi == kInt64Max || hi == kIntMax
                            ? ">= " + std::to_string(lo)
                            : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return Error(n.source(),
                 "'" + std::string(key) + "' must be " + range + ", got " + std::to_string(x));
  }
  return x;
}

Result<double> PlanParser::Number(const toml::node& n, std::string_view key, double lo) const {
  double x = 0.0;
  if (const auto* i = n.as_integer()) {
    x = static_cast<double>(i->get());
  } else if (const auto* f = n.as_floating_point()) {
    x = f->get();
  } else {
    return TypeError(n, key, "a number");
  }
  if (!std::isfinite(x) || x < lo) {
    std::ostringstream os;
    os << "'" << key << "' must be a finite number >= " << lo << ", got " << x;
    return Error(n.source(), os.str());
  }
  return x;
}

Result<bool> PlanParser::Bool(const toml::node& n, std::string_view key) const {
  const toml::value<bool>* v = n.as_boolean();
  if (v == nullptr) return TypeError(n, key, "true or false");
  return v->get();
}

Result<std::vector<std::string>> PlanParser::StringList(
    const toml::node& n, std::string_view key, std::vector<const toml::node*>* elements) const {
  const toml::array* a = n.as_array();
  if (a == nullptr) return TypeError(n, key, "an array of strings");
  std::vector<std::string> out;
  for (const toml::node& e : *a) {
    if (!e.is_string())
      return Error(e.source(), "'" + std::string(key) +
                                   "' must be an array of strings, got an element of type " +
                                   TypeName(e));
    out.push_back(e.as_string()->get());
    if (elements != nullptr) elements->push_back(&e);
  }
  return out;
}

Result<std::string> PlanParser::ExistingPath(const toml::node& n, std::string_view key,
                                             bool folder) const {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string given, String(n, key));
  fs::path p(given);
  if (p.is_relative()) p = fs::path(plan_dir_) / p;
  p = p.lexically_normal();
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  const bool found = folder ? fs::is_directory(st) : fs::is_regular_file(st);
  if (!found)
    return Error(n.source(), "'" + std::string(key) + "': " + (folder ? "folder '" : "file '") +
                                 given + "' not found (resolved to " + p.string() + ")");
  return p.string();
}

Result<nlohmann::json> PlanParser::EngineValue(const toml::node& n, const std::string& key,
                                               const nlohmann::json& want) const {
  if (want.is_boolean()) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool b, Bool(n, key));
    return nlohmann::json(b);
  }
  if (want.is_number_integer()) {
    const auto* v = n.as_integer();
    if (v == nullptr) return TypeError(n, key, "an integer");
    return nlohmann::json(v->get());
  }
  if (want.is_number_float()) {
    if (const auto* v = n.as_integer()) return nlohmann::json(static_cast<double>(v->get()));
    if (const auto* v = n.as_floating_point()) return nlohmann::json(v->get());
    return TypeError(n, key, "a number");
  }
  if (want.is_string()) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string s, String(n, key, /*allow_empty=*/true));
    return nlohmann::json(s);
  }
  // null: any scalar (array elements of a list key this parser has no element type for).
  if (const auto* v = n.as_integer()) return nlohmann::json(v->get());
  if (const auto* v = n.as_floating_point()) return nlohmann::json(v->get());
  if (const auto* v = n.as_boolean()) return nlohmann::json(v->get());
  if (const auto* v = n.as_string()) return nlohmann::json(v->get());
  return TypeError(n, key, "a string, number or boolean");
}

}  // namespace lockstep::plan_internal
