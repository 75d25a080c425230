#include "chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace lockstep::jinja {

const Value* Object::Find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::Set(std::string_view key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(std::string(key), std::move(v));
}

Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::Int(std::int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::Float(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::Str(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::List(Array x) {
  Value v;
  v.kind = Kind::kArray;
  v.arr = std::make_shared<Array>(std::move(x));
  return v;
}
Value Value::Dict(std::shared_ptr<Object> o) {
  Value v;
  v.kind = Kind::kObject;
  v.obj = std::move(o);
  return v;
}
Value Value::Function(std::string name) {
  Value v;
  v.kind = Kind::kFunction;
  v.s = std::move(name);
  return v;
}

bool Value::Truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b;
    case Kind::kInt:
      return i != 0;
    case Kind::kFloat:
      return f != 0;
    case Kind::kString:
      return !s.empty();
    case Kind::kArray:
      return !arr->empty();
    case Kind::kObject:
      return !obj->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind == K::kInt && b.kind == K::kInt) return a.i == b.i;
    return a.AsDouble() == b.AsDouble();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kBool:
      return a.b == b.b;
    case K::kString:
    case K::kFunction:
      return a.s == b.s;
    case K::kArray:
      if (a.arr->size() != b.arr->size()) return false;
      for (std::size_t k = 0; k < a.arr->size(); ++k)
        if (!Equal((*a.arr)[k], (*b.arr)[k])) return false;
      return true;
    case K::kObject: {
      if (a.obj->items.size() != b.obj->items.size()) return false;
      for (const auto& [key, v] : a.obj->items) {
        const Value* w = b.obj->Find(key);
        if (!w || !Equal(v, *w)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

namespace {

std::string FloatText(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

void Repr(const Value& v, std::string& out) {
  if (v.is_string()) {
    out += '\'';
    for (char c : v.s) {
      if (c == '\'' || c == '\\') out += '\\';
      out += c;
    }
    out += '\'';
    return;
  }
  if (v.kind == Value::Kind::kArray) {
    out += '[';
    for (std::size_t k = 0; k < v.arr->size(); ++k) {
      if (k) out += ", ";
      Repr((*v.arr)[k], out);
    }
    out += ']';
    return;
  }
  if (v.kind == Value::Kind::kObject) {
    out += '{';
    bool first = true;
    for (const auto& [key, x] : v.obj->items) {
      if (!first) out += ", ";
      first = false;
      Repr(Value::Str(key), out);
      out += ": ";
      Repr(x, out);
    }
    out += '}';
    return;
  }
  out += ToText(v);
}

void JsonString(std::string_view s, std::string& out) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace

std::string ToText(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return FloatText(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kFunction:
      return "<function " + v.s + ">";
    default: {
      std::string out;
      Repr(v, out);
      return out;
    }
  }
}

bool ToJsonText(const Value& v, int indent, std::string& out, int depth) {
  if (depth > 64) return false;
  const bool pretty = indent >= 0;
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      out += "null";
      return true;
    case Value::Kind::kBool:
      out += v.b ? "true" : "false";
      return true;
    case Value::Kind::kInt:
      out += std::to_string(v.i);
      return true;
    case Value::Kind::kFloat: {
      if (!std::isfinite(v.f)) return false;
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof(buf), v.f);
      out.append(buf, r.ptr);
      return true;
    }
    case Value::Kind::kString:
      JsonString(v.s, out);
      return true;
    case Value::Kind::kArray: {
      out += '[';
      for (std::size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += pretty ? "," : ", ";
        if (pretty) newline(depth + 1);
        if (!ToJsonText((*v.arr)[k], indent, out, depth + 1)) return false;
      }
      if (pretty && !v.arr->empty()) newline(depth);
      out += ']';
      return true;
    }
    case Value::Kind::kObject: {
      out += '{';
      bool first = true;
      for (const auto& [key, x] : v.obj->items) {
        if (!first) out += pretty ? "," : ", ";
        first = false;
        if (pretty) newline(depth + 1);
        JsonString(key, out);
        out += ": ";
        if (!ToJsonText(x, indent, out, depth + 1)) return false;
      }
      if (pretty && !v.obj->items.empty()) newline(depth);
      out += '}';
      return true;
    }
    case Value::Kind::kFunction:
      return false;
  }
  return false;
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::Int(static_cast<std::int64_t>(j.get<std::uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& x : j) a.push_back(FromJson(x));
      return Value::List(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = j.begin(); it != j.end(); ++it) o->items.emplace_back(it.key(), FromJson(*it));
      return Value::Dict(std::move(o));
    }
    default:
      return Value();
  }
}

std::string_view KindName(Value::Kind k) {
  switch (k) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "boolean";
    case Value::Kind::kInt:
      return "integer";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kArray:
      return "list";
    case Value::Kind::kObject:
      return "dict";
    case Value::Kind::kFunction:
      return "function";
  }
  return "?";
}

}  // namespace lockstep::jinja
