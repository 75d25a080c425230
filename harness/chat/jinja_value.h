// The values a chat template computes with: Jinja's undefined and none, booleans, integers,
// floats, strings (UTF-8 bytes), lists and dicts (insertion-ordered, shared by reference as in
// Python, so `namespace()` attributes set inside a loop are seen after it) and the few global
// functions (namespace, range, raise_exception). Conversion from JSON (the request's messages)
// and to JSON text (`tojson`: Python's json.dumps(ensure_ascii=False) separators ", " and ": ").
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::jinja {

struct Value;
using Array = std::vector<Value>;
struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  bool is_namespace = false;                         // `set ns.x = ...` is allowed on it
  const Value* Find(std::string_view key) const;
  void Set(std::string_view key, Value v);
};

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };
  Kind kind = Kind::kUndefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;  // the string, or the global function's name
  std::shared_ptr<Array> arr;
  std::shared_ptr<Object> obj;

  static Value None();
  static Value Bool(bool v);
  static Value Int(std::int64_t v);
  static Value Float(double v);
  static Value Str(std::string v);
  static Value List(Array v);
  static Value Dict(std::shared_ptr<Object> o);
  static Value Function(std::string name);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  bool Truthy() const;
  double AsDouble() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }
};

// Python's equality: numbers by value (1 == 1.0), strings, lists and dicts element-wise;
// undefined equals undefined only; values of different kinds are unequal.
bool Equal(const Value& a, const Value& b);

// What `{{ v }}` prints: strings as they are, integers in decimal, floats as Python's repr
// (1.0, 0.1), True / False, None, "" for undefined, lists and dicts as Python's repr.
std::string ToText(const Value& v);

// JSON text of `v` (`indent` < 0: one line with ", " and ": "; else pretty with that indent and
// "," between items); undefined is null; strings escape '"', '\\' and control characters, other
// characters stay as they are (ensure_ascii=False). Functions are an error the caller reports.
bool ToJsonText(const Value& v, int indent, std::string& out, int depth = 0);

// The JSON value as a template value: objects keep their key order.
Value FromJson(const nlohmann::ordered_json& j);

// The kind's name for messages ("string", "list", ...).
std::string_view KindName(Value::Kind k);

}  // namespace lockstep::jinja
