#include "chat/jinja_render.h"

#include <algorithm>
#include <cmath>

namespace lockstep::jinja {

namespace {

using K = Value::Kind;

constexpr std::int64_t kMaxRange = 100'000;  // items of one range()

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Byte offsets of each code point's start, and the string's size last.
std::vector<std::size_t> CodePoints(const std::string& s) {
  std::vector<std::size_t> at;
  for (std::size_t k = 0; k < s.size(); ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) at.push_back(k);
  at.push_back(s.size());
  return at;
}

// Python's slice indices for a sequence of `n` over [start, stop) by step.
std::vector<std::int64_t> SliceIndices(std::int64_t n, const Value& a, const Value& b,
                                       std::int64_t step) {
  std::vector<std::int64_t> out;
  auto clamp = [&](const Value& v, std::int64_t dflt, bool upper) {
    if (v.kind != K::kInt) return dflt;
    std::int64_t x = v.i < 0 ? v.i + n : v.i;
    if (step > 0) return std::clamp<std::int64_t>(x, 0, n);
    return std::clamp<std::int64_t>(x, -1, n - 1) + (upper ? 0 : 0);
  };
  if (step > 0) {
    const std::int64_t lo = clamp(a, 0, false), hi = clamp(b, n, true);
    for (std::int64_t k = lo; k < hi; k += step) out.push_back(k);
  } else {
    const std::int64_t hi = clamp(a, n - 1, false), lo = clamp(b, -1, true);
    for (std::int64_t k = hi; k > lo; k += step) out.push_back(k);
  }
  return out;
}

std::string StripChars(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip = [&](char c) {
    if (!chars || chars->is_none()) return IsSpace(c);
    return chars->s.find(c) != std::string::npos;
  };
  std::size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip(s[b])) ++b;
  if (right)
    while (e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

class Renderer {
 public:
  Renderer(const RenderLimits& limits) : limits_(limits) {}

  Result<std::string> Run(const Body& body,
                          const std::vector<std::pair<std::string, Value>>& globals) {
    frames_.emplace_back();
    frames_.back().Set("namespace", Value::Function("namespace"));
    frames_.back().Set("range", Value::Function("range"));
    frames_.back().Set("raise_exception", Value::Function("raise_exception"));
    for (const auto& [k, v] : globals) frames_.back().Set(k, v);
    LOCKSTEP_RETURN_IF_ERROR(Exec(body));
    return std::move(out_);
  }

 private:
  Status Error(int line, std::string_view what) const {
    return Status::InvalidArgument("chat template: " + std::string(what) + " at line " +
                                   std::to_string(line));
  }
  Status Step(int line) {
    if (++steps_ > limits_.max_steps)
      return Error(line, "stopped after " + std::to_string(limits_.max_steps) + " steps");
    return Status::Ok();
  }
  Status CheckSize(int line, std::size_t n) const {
    if (n > limits_.max_output_bytes)
      return Error(line, "a string or list over " + std::to_string(limits_.max_output_bytes) +
                             " bytes or items");
    return Status::Ok();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (const Value* v = it->Find(name)) return *v;
    return Value();
  }

  Status Exec(const Body& body) {
    for (const StmtPtr& s : body) LOCKSTEP_RETURN_IF_ERROR(ExecOne(*s));
    return Status::Ok();
  }

  Status ExecOne(const Stmt& s) {
    LOCKSTEP_RETURN_IF_ERROR(Step(s.line));
    switch (s.kind) {
      case Stmt::Kind::kText:
        out_ += s.text;
        return CheckSize(s.line, out_.size());
      case Stmt::Kind::kOutput: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (v.kind == K::kFunction) return Error(s.line, "cannot print a function");
        out_ += ToText(v);
        return CheckSize(s.line, out_.size());
      }
      case Stmt::Kind::kIf: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value c, Eval(*s.expr));
        return Exec(c.Truthy() ? s.body : s.else_body);
      }
      case Stmt::Kind::kSet: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (s.attr.empty()) {
          frames_.back().Set(s.targets[0], std::move(v));
          return Status::Ok();
        }
        Value ns = Lookup(s.targets[0]);
        if (ns.kind != K::kObject || !ns.obj->is_namespace)
          return Error(s.line, "'" + s.targets[0] + "' is not a namespace()");
        ns.obj->Set(s.attr, std::move(v));
        return Status::Ok();
      }
      case Stmt::Kind::kFor:
        return ExecFor(s);
    }
    return Status::Ok();
  }

  Result<Array> Items(const Value& v, int line) const {
    switch (v.kind) {
      case K::kUndefined:
        return Array{};
      case K::kArray:
        return *v.arr;
      case K::kObject: {
        Array keys;
        for (const auto& kv : v.obj->items) keys.push_back(Value::Str(kv.first));
        return keys;
      }
      case K::kString: {
        Array chars;
        const auto at = CodePoints(v.s);
        for (std::size_t k = 0; k + 1 < at.size(); ++k)
          chars.push_back(Value::Str(v.s.substr(at[k], at[k + 1] - at[k])));
        return chars;
      }
      default:
        return Error(line, std::string("cannot iterate over ") + std::string(KindName(v.kind)));
    }
  }

  Status ExecFor(const Stmt& s) {
    LOCKSTEP_ASSIGN_OR_RETURN(Value seq, Eval(*s.expr));
    LOCKSTEP_ASSIGN_OR_RETURN(Array all, Items(seq, s.line));
    auto bind = [&](Object& frame, const Value& item) -> Status {
      if (s.targets.size() == 1) {
        frame.Set(s.targets[0], item);
        return Status::Ok();
      }
      if (item.kind != K::kArray || item.arr->size() != s.targets.size())
        return Error(s.line, "cannot unpack the loop item into " +
                                 std::to_string(s.targets.size()) + " names");
      for (std::size_t k = 0; k < s.targets.size(); ++k) frame.Set(s.targets[k], (*item.arr)[k]);
      return Status::Ok();
    };
    Array items;
    if (s.filter) {
      for (const Value& item : all) {
        frames_.emplace_back();
        Status st = bind(frames_.back(), item);
        Result<Value> keep = st.ok() ? Eval(*s.filter) : Result<Value>(st);
        frames_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return Exec(s.else_body);
    const auto n = static_cast<std::int64_t>(items.size());
    for (std::int64_t k = 0; k < n; ++k) {
      LOCKSTEP_RETURN_IF_ERROR(Step(s.line));
      frames_.emplace_back();
      auto loop = std::make_shared<Object>();
      loop->Set("index0", Value::Int(k));
      loop->Set("index", Value::Int(k + 1));
      loop->Set("revindex0", Value::Int(n - k - 1));
      loop->Set("revindex", Value::Int(n - k));
      loop->Set("first", Value::Bool(k == 0));
      loop->Set("last", Value::Bool(k == n - 1));
      loop->Set("length", Value::Int(n));
      loop->Set("previtem", k > 0 ? items[static_cast<std::size_t>(k - 1)] : Value());
      loop->Set("nextitem", k + 1 < n ? items[static_cast<std::size_t>(k + 1)] : Value());
      frames_.back().Set("loop", Value::Dict(std::move(loop)));
      Status st = bind(frames_.back(), items[static_cast<std::size_t>(k)]);
      if (st.ok()) st = Exec(s.body);
      frames_.pop_back();
      LOCKSTEP_RETURN_IF_ERROR(st);
    }
    return Status::Ok();
  }

  Result<std::vector<Value>> EvalArgs(const Expr& e, std::size_t from) {
    std::vector<Value> out;
    for (std::size_t k = from; k < e.args.size(); ++k) {
      LOCKSTEP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k]));
      out.push_back(std::move(v));
    }
    return out;
  }
  Result<std::vector<std::pair<std::string, Value>>> EvalKwargs(const Expr& e) {
    std::vector<std::pair<std::string, Value>> out;
    for (const auto& [k, x] : e.kwargs) {
      LOCKSTEP_ASSIGN_OR_RETURN(Value v, Eval(*x));
      out.emplace_back(k, std::move(v));
    }
    return out;
  }

  Result<Value> Eval(const Expr& e) {
    LOCKSTEP_RETURN_IF_ERROR(Step(e.line));
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Value> items, EvalArgs(e, 0));
        return Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        auto o = std::make_shared<Object>();
        for (std::size_t k = 0; k + 1 < e.args.size(); k += 2) {
          LOCKSTEP_ASSIGN_OR_RETURN(Value key, Eval(*e.args[k]));
          if (!key.is_string()) return Error(e.line, "dict keys must be strings");
          LOCKSTEP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1]));
          o->Set(key.s, std::move(v));
        }
        return Value::Dict(std::move(o));
      }
      case Expr::Kind::kAttr: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return Attr(obj, e.name, e.line, e.args[0].get());
      }
      case Expr::Kind::kIndex: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        LOCKSTEP_ASSIGN_OR_RETURN(Value idx, Eval(*e.args[1]));
        return Index(obj, idx, e.line);
      }
      case Expr::Kind::kSlice:
        return Slice(e);
      case Expr::Kind::kCall:
        return Call(e);
      case Expr::Kind::kFilter: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Value> args, EvalArgs(e, 1));
        LOCKSTEP_ASSIGN_OR_RETURN(auto kwargs, EvalKwargs(e));
        return Filter(e.name, x, args, kwargs, e.line);
      }
      case Expr::Kind::kTest: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Value> args, EvalArgs(e, 1));
        LOCKSTEP_ASSIGN_OR_RETURN(bool r, Test(e.name, x, args, e.line));
        return Value::Bool(r != e.negate);
      }
      case Expr::Kind::kUnary: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        if (e.name == "not") return Value::Bool(!x.Truthy());
        if (x.kind == K::kInt) return e.name == "-" ? Value::Int(-x.i) : x;
        if (x.kind == K::kFloat) return e.name == "-" ? Value::Float(-x.f) : x;
        return Error(e.line, "unary " + e.name + " needs a number");
      }
      case Expr::Kind::kBinary:
        return Binary(e);
      case Expr::Kind::kCond: {
        LOCKSTEP_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (!e.args[2]) return Value();
        return Eval(*e.args[2]);
      }
    }
    return Value();
  }

  Result<Value> Attr(const Value& obj, const std::string& name, int line, const Expr* of) {
    if (obj.kind == K::kObject) {
      if (const Value* v = obj.obj->Find(name)) return *v;
      return Value();
    }
    if (obj.is_undefined())
      return Error(line, "'" + (of && of->kind == Expr::Kind::kName ? of->name : "value") +
                             "' is undefined (reading ." + name + ")");
    if (obj.is_none()) return Error(line, "None has no attribute '" + name + "'");
    return Value();  // a method, resolved by Call; as a value it is undefined
  }

  Result<Value> Index(const Value& obj, const Value& idx, int line) {
    if (obj.kind == K::kObject) {
      if (!idx.is_string()) return Value();
      if (const Value* v = obj.obj->Find(idx.s)) return *v;
      return Value();
    }
    if (obj.kind == K::kArray || obj.kind == K::kString) {
      if (idx.kind != K::kInt) return Error(line, "indices must be integers");
      if (obj.kind == K::kArray) {
        const auto n = static_cast<std::int64_t>(obj.arr->size());
        const std::int64_t k = idx.i < 0 ? idx.i + n : idx.i;
        if (k < 0 || k >= n) return Value();
        return (*obj.arr)[static_cast<std::size_t>(k)];
      }
      const auto at = CodePoints(obj.s);
      const auto n = static_cast<std::int64_t>(at.size()) - 1;
      const std::int64_t k = idx.i < 0 ? idx.i + n : idx.i;
      if (k < 0 || k >= n) return Value();
      const auto uk = static_cast<std::size_t>(k);
      return Value::Str(obj.s.substr(at[uk], at[uk + 1] - at[uk]));
    }
    if (obj.is_undefined()) return Error(line, "subscript of an undefined value");
    return Error(line, std::string("cannot index ") + std::string(KindName(obj.kind)));
  }

  Result<Value> Slice(const Expr& e) {
    LOCKSTEP_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    Value part[3];
    for (int k = 0; k < 3; ++k)
      if (e.args[static_cast<std::size_t>(k + 1)]) {
        LOCKSTEP_ASSIGN_OR_RETURN(part[k], Eval(*e.args[static_cast<std::size_t>(k + 1)]));
        if (!part[k].is_none() && part[k].kind != K::kInt)
          return Error(e.line, "slice indices must be integers");
      }
    const std::int64_t step = part[2].kind == K::kInt ? part[2].i : 1;
    if (step == 0) return Error(e.line, "slice step cannot be zero");
    if (obj.kind == K::kArray) {
      Array out;
      for (std::int64_t k :
           SliceIndices(static_cast<std::int64_t>(obj.arr->size()), part[0], part[1], step))
        out.push_back((*obj.arr)[static_cast<std::size_t>(k)]);
      return Value::List(std::move(out));
    }
    if (obj.kind == K::kString) {
      const auto at = CodePoints(obj.s);
      std::string out;
      for (std::int64_t k :
           SliceIndices(static_cast<std::int64_t>(at.size()) - 1, part[0], part[1], step)) {
        const auto uk = static_cast<std::size_t>(k);
        out.append(obj.s, at[uk], at[uk + 1] - at[uk]);
      }
      return Value::Str(std::move(out));
    }
    return Error(e.line, std::string("cannot slice ") + std::string(KindName(obj.kind)));
  }

  Result<Value> Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Value> args, EvalArgs(e, 1));
    LOCKSTEP_ASSIGN_OR_RETURN(auto kwargs, EvalKwargs(e));
    if (callee.kind == Expr::Kind::kAttr) {
      LOCKSTEP_ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
      if (obj.is_string() || obj.kind == K::kObject || obj.kind == K::kArray)
        return Method(obj, callee.name, args, e.line);
      return Error(e.line,
                   std::string(KindName(obj.kind)) + " has no method '" + callee.name + "'");
    }
    LOCKSTEP_ASSIGN_OR_RETURN(Value fn, Eval(callee));
    if (fn.kind != K::kFunction)
      return Error(e.line, "'" + (callee.kind == Expr::Kind::kName ? callee.name : "value") +
                               "' is not callable");
    if (fn.s == "namespace") {
      auto o = std::make_shared<Object>();
      o->is_namespace = true;
      for (auto& [k, v] : kwargs) o->Set(k, std::move(v));
      return Value::Dict(std::move(o));
    }
    if (fn.s == "raise_exception") {
      return Status::InvalidArgument("chat template raised an error: " +
                                     (args.empty() ? std::string() : ToText(args[0])));
    }
    // range
    std::int64_t lo = 0, hi = 0, step = 1;
    for (const Value& a : args)
      if (a.kind != K::kInt) return Error(e.line, "range() takes integers");
    if (args.size() == 1) hi = args[0].i;
    if (args.size() >= 2) lo = args[0].i, hi = args[1].i;
    if (args.size() == 3) step = args[2].i;
    if (args.empty() || args.size() > 3 || step == 0) return Error(e.line, "bad range()");
    const double n_items =
        (static_cast<double>(hi) - static_cast<double>(lo)) / static_cast<double>(step);
    if (n_items > kMaxRange)
      return Error(e.line, "range() of more than " + std::to_string(kMaxRange) + " items");
    Array out;
    for (std::int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
      LOCKSTEP_RETURN_IF_ERROR(Step(e.line));
      out.push_back(Value::Int(k));
    }
    return Value::List(std::move(out));
  }

  Result<Value> Method(const Value& obj, const std::string& name, const std::vector<Value>& args,
                       int line) {
    auto str_arg = [&](std::size_t k) -> const Value* {
      return k < args.size() && args[k].is_string() ? &args[k] : nullptr;
    };
    if (obj.kind == K::kObject) {
      if (name == "items") {
        Array out;
        for (const auto& [k, v] : obj.obj->items) out.push_back(Value::List({Value::Str(k), v}));
        return Value::List(std::move(out));
      }
      if (name == "keys" || name == "values") {
        Array out;
        for (const auto& [k, v] : obj.obj->items) out.push_back(name == "keys" ? Value::Str(k) : v);
        return Value::List(std::move(out));
      }
      if (name == "get") {
        if (const Value* key = str_arg(0))
          if (const Value* v = obj.obj->Find(key->s)) return *v;
        return args.size() > 1 ? args[1] : Value::None();
      }
      return Error(line, "dict has no method '" + name + "'");
    }
    if (obj.kind == K::kArray) return Error(line, "list has no method '" + name + "'");
    const std::string& s = obj.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = args.empty() ? nullptr : &args[0];
      if (chars && !chars->is_string() && !chars->is_none())
        return Error(line, name + "() takes a string");
      return Value::Str(StripChars(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "startswith" || name == "endswith") {
      if (args.size() != 1) return Error(line, name + "() takes one argument");
      Array options;
      if (args[0].is_string()) options.push_back(args[0]);
      if (args[0].kind == K::kArray) options = *args[0].arr;
      for (const Value& o : options) {
        if (!o.is_string()) return Error(line, name + "() takes strings");
        if (o.s.size() <= s.size() &&
            (name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                  : s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0))
          return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "split") {
      Array out;
      std::int64_t max_split = args.size() > 1 && args[1].kind == K::kInt ? args[1].i : -1;
      if (const Value* sep = str_arg(0)) {
        if (sep->s.empty()) return Error(line, "split(): empty separator");
        std::size_t b = 0;
        for (;;) {
          const std::size_t f = max_split == 0 ? std::string::npos : s.find(sep->s, b);
          if (f == std::string::npos) break;
          out.push_back(Value::Str(s.substr(b, f - b)));
          b = f + sep->s.size();
          if (max_split > 0) --max_split;
        }
        out.push_back(Value::Str(s.substr(b)));
      } else {
        std::size_t b = 0;
        for (;;) {
          while (b < s.size() && IsSpace(s[b])) ++b;
          if (b >= s.size()) break;
          std::size_t f = b;
          if (max_split == 0) {
            f = s.size();
            while (f > b && IsSpace(s[f - 1])) --f;
            out.push_back(Value::Str(s.substr(b, f - b)));
            break;
          }
          while (f < s.size() && !IsSpace(s[f])) ++f;
          out.push_back(Value::Str(s.substr(b, f - b)));
          b = f;
          if (max_split > 0) --max_split;
        }
      }
      LOCKSTEP_RETURN_IF_ERROR(Step(line));
      return Value::List(std::move(out));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
      return Filter(name, obj, {}, {}, line);
    if (name == "replace") {
      if (args.size() < 2 || !args[0].is_string() || !args[1].is_string())
        return Error(line, "replace() takes two strings");
      return Filter("replace", obj, args, {}, line);
    }
    if (name == "join") {
      if (args.size() != 1) return Error(line, "join() takes one argument");
      return Filter("join", args[0], {obj}, {}, line);
    }
    return Error(line, "string has no method '" + name + "'");
  }

  Result<Value> Filter(const std::string& name, const Value& x, const std::vector<Value>& args,
                       const std::vector<std::pair<std::string, Value>>& kwargs, int line) {
    auto kwarg = [&](std::string_view key, std::size_t pos) -> const Value* {
      for (const auto& [k, v] : kwargs)
        if (k == key) return &v;
      return pos < args.size() ? &args[pos] : nullptr;
    };
    if (name == "length" || name == "count") {
      if (x.is_string()) return Value::Int(static_cast<std::int64_t>(CodePoints(x.s).size() - 1));
      if (x.kind == K::kArray) return Value::Int(static_cast<std::int64_t>(x.arr->size()));
      if (x.kind == K::kObject) return Value::Int(static_cast<std::int64_t>(x.obj->items.size()));
      if (x.is_undefined()) return Value::Int(0);
      return Error(line, "length of " + std::string(KindName(x.kind)));
    }
    if (name == "tojson") {
      const Value* indent = kwarg("indent", 0);
      std::string out;
      if (!ToJsonText(x, indent && indent->kind == K::kInt ? static_cast<int>(indent->i) : -1, out))
        return Error(line, "tojson: value cannot be written as JSON");
      LOCKSTEP_RETURN_IF_ERROR(CheckSize(line, out.size()));
      return Value::Str(std::move(out));
    }
    if (name == "safe" || name == "string") return name == "safe" ? x : Value::Str(ToText(x));
    if (name == "default" || name == "d") {
      const Value* dflt = kwarg("default_value", 0);
      const Value* boolean = kwarg("boolean", 1);
      const bool use = boolean && boolean->Truthy() ? !x.Truthy() : x.is_undefined();
      return use ? (dflt ? *dflt : Value::Str("")) : x;
    }
    if (name == "first" || name == "last") {
      LOCKSTEP_ASSIGN_OR_RETURN(Array items, Items(x, line));
      if (items.empty()) return Value();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      LOCKSTEP_ASSIGN_OR_RETURN(Array items, Items(x, line));
      return Value::List(std::move(items));
    }
    if (name == "reverse") {
      if (x.is_string()) {
        const auto at = CodePoints(x.s);
        std::string out;
        for (std::size_t k = at.size() - 1; k > 0; --k)
          out.append(x.s, at[k - 1], at[k] - at[k - 1]);
        return Value::Str(std::move(out));
      }
      LOCKSTEP_ASSIGN_OR_RETURN(Array items, Items(x, line));
      std::reverse(items.begin(), items.end());
      return Value::List(std::move(items));
    }
    if (name == "items") {
      if (x.kind != K::kObject) return Error(line, "items of " + std::string(KindName(x.kind)));
      return Method(x, "items", {}, line);
    }
    if (name == "join") {
      LOCKSTEP_ASSIGN_OR_RETURN(Array items, Items(x, line));
      const Value* sep = kwarg("d", 0);
      std::string out;
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k && sep) out += ToText(*sep);
        out += ToText(items[k]);
        LOCKSTEP_RETURN_IF_ERROR(CheckSize(line, out.size()));
      }
      return Value::Str(std::move(out));
    }
    if (name == "int") {
      if (x.kind == K::kInt) return x;
      if (x.kind == K::kFloat) return Value::Int(static_cast<std::int64_t>(x.f));
      if (x.kind == K::kBool) return Value::Int(x.b ? 1 : 0);
      if (x.is_string()) return Value::Int(std::strtoll(x.s.c_str(), nullptr, 10));
      return Value::Int(0);
    }
    if (name == "float") {
      if (x.is_number()) return Value::Float(x.AsDouble());
      if (x.is_string()) return Value::Float(std::strtod(x.s.c_str(), nullptr));
      return Value::Float(0);
    }
    if (name == "abs") {
      if (x.kind == K::kInt) return Value::Int(x.i < 0 ? -x.i : x.i);
      if (x.kind == K::kFloat) return Value::Float(std::fabs(x.f));
      return Error(line, "abs of " + std::string(KindName(x.kind)));
    }
    if (!x.is_string())
      return Error(
          line, "filter '" + name + "' of " + std::string(KindName(x.kind)) + " is not supported");
    return StringFilter(name, x.s, args, line);
  }

  // The filters of strings alone (trim, upper, lower, capitalize, title, replace).
  Result<Value> StringFilter(const std::string& name, std::string s, const std::vector<Value>& args,
                             int line) {
    if (name == "trim") return Value::Str(StripChars(s, nullptr, true, true));
    if (name == "upper" || name == "lower") {
      for (char& c : s)
        if (name == "upper" ? (c >= 'a' && c <= 'z') : (c >= 'A' && c <= 'Z'))
          c = static_cast<char>(c ^ 0x20);
      return Value::Str(std::move(s));
    }
    if (name == "capitalize" || name == "title") {
      bool start = true;
      for (char& c : s) {
        const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (alpha) {
          const bool up = start;
          if (up && c >= 'a' && c <= 'z') c = static_cast<char>(c ^ 0x20);
          if (!up && c >= 'A' && c <= 'Z') c = static_cast<char>(c ^ 0x20);
        }
        start = name == "title" ? !alpha : false;
      }
      return Value::Str(std::move(s));
    }
    if (name == "replace") {
      if (args.size() < 2 || !args[0].is_string() || !args[1].is_string())
        return Error(line, "replace takes two strings");
      const std::string& from = args[0].s;
      std::int64_t max = args.size() > 2 && args[2].kind == K::kInt ? args[2].i : -1;
      if (from.empty()) return Error(line, "replace: empty pattern");
      std::string out;
      std::size_t b = 0;
      for (std::size_t f; max != 0 && (f = s.find(from, b)) != std::string::npos; --max) {
        out.append(s, b, f - b);
        out += args[1].s;
        b = f + from.size();
        LOCKSTEP_RETURN_IF_ERROR(CheckSize(line, out.size()));
      }
      out.append(s, b);
      return Value::Str(std::move(out));
    }
    return Error(line, "unsupported filter '" + name + "'");
  }

  Result<bool> Test(const std::string& name, const Value& x, const std::vector<Value>& args,
                    int line) {
    if (name == "defined") return !x.is_undefined();
    if (name == "undefined") return x.is_undefined();
    if (name == "none") return x.is_none();
    if (name == "string") return x.is_string();
    if (name == "number") return x.is_number();
    if (name == "integer") return x.kind == K::kInt;
    if (name == "float") return x.kind == K::kFloat;
    if (name == "boolean") return x.kind == K::kBool;
    if (name == "mapping") return x.kind == K::kObject;
    if (name == "sequence" || name == "iterable")
      return x.kind == K::kArray || x.is_string() || (name == "iterable" && x.kind == K::kObject);
    if (name == "true") return x.kind == K::kBool && x.b;
    if (name == "false") return x.kind == K::kBool && !x.b;
    if (name == "odd" || name == "even") {
      if (x.kind != K::kInt) return Error(line, "'" + name + "' needs an integer");
      return (x.i % 2 != 0) == (name == "odd");
    }
    if (args.size() != 1) return Error(line, "unsupported test '" + name + "'");
    const Value& y = args[0];
    if (name == "eq" || name == "equalto" || name == "sameas") return Equal(x, y);
    if (name == "ne") return !Equal(x, y);
    if (name == "lt" || name == "gt") {
      if (!x.is_number() || !y.is_number()) return Error(line, "'" + name + "' needs numbers");
      return name == "lt" ? x.AsDouble() < y.AsDouble() : x.AsDouble() > y.AsDouble();
    }
    if (name == "divisibleby") {
      if (x.kind != K::kInt || y.kind != K::kInt || y.i == 0)
        return Error(line, "'divisibleby' needs integers");
      return x.i % y.i == 0;
    }
    if (name == "in") return Contains(y, x, line);
    return Error(line, "unsupported test '" + name + "'");
  }

  Result<bool> Contains(const Value& hay, const Value& needle, int line) {
    if (hay.is_string()) {
      if (!needle.is_string()) return Error(line, "'in <string>' needs a string");
      return hay.s.find(needle.s) != std::string::npos;
    }
    if (hay.kind == K::kArray) {
      for (const Value& v : *hay.arr)
        if (Equal(v, needle)) return true;
      return false;
    }
    if (hay.kind == K::kObject) return needle.is_string() && hay.obj->Find(needle.s) != nullptr;
    if (hay.is_undefined()) return false;
    return Error(line, "'in' of " + std::string(KindName(hay.kind)));
  }

  Result<Value> Binary(const Expr& e) {
    const std::string& op = e.name;
    LOCKSTEP_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
    if (op == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.args[1]);
    LOCKSTEP_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
    if (op == "==") return Value::Bool(Equal(a, b));
    if (op == "!=") return Value::Bool(!Equal(a, b));
    if (op == "in" || op == "not in") {
      LOCKSTEP_ASSIGN_OR_RETURN(bool r, Contains(b, a, e.line));
      return Value::Bool(r == (op == "in"));
    }
    if (op == "~") {
      std::string s = ToText(a) + ToText(b);
      LOCKSTEP_RETURN_IF_ERROR(CheckSize(e.line, s.size()));
      return Value::Str(std::move(s));
    }
    if (op == "+" && a.is_string() && b.is_string()) {
      LOCKSTEP_RETURN_IF_ERROR(CheckSize(e.line, a.s.size() + b.s.size()));
      return Value::Str(a.s + b.s);
    }
    if (op == "+" && a.kind == K::kArray && b.kind == K::kArray) {
      LOCKSTEP_RETURN_IF_ERROR(CheckSize(e.line, a.arr->size() + b.arr->size()));
      Array out = *a.arr;
      out.insert(out.end(), b.arr->begin(), b.arr->end());
      return Value::List(std::move(out));
    }
    if (op == "*" && a.is_string() && b.kind == K::kInt) {
      const std::int64_t n = std::max<std::int64_t>(b.i, 0);
      if (n > 0 && a.s.size() > limits_.max_output_bytes / static_cast<std::size_t>(n))
        return CheckSize(e.line, limits_.max_output_bytes + 1);
      std::string out;
      for (std::int64_t k = 0; k < n; ++k) out += a.s;
      return Value::Str(std::move(out));
    }
    if ((op == "<" || op == ">" || op == "<=" || op == ">=") && a.is_string() && b.is_string()) {
      const int c = a.s.compare(b.s);
      return Value::Bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (!a.is_number() || !b.is_number())
      return Error(e.line, "cannot apply '" + op + "' to " + std::string(KindName(a.kind)) +
                               " and " + std::string(KindName(b.kind)));
    const bool ints = a.kind == K::kInt && b.kind == K::kInt;
    const double x = a.AsDouble(), y = b.AsDouble();
    if (op == "<") return Value::Bool(ints ? a.i < b.i : x < y);
    if (op == ">") return Value::Bool(ints ? a.i > b.i : x > y);
    if (op == "<=") return Value::Bool(ints ? a.i <= b.i : x <= y);
    if (op == ">=") return Value::Bool(ints ? a.i >= b.i : x >= y);
    if (op == "+") return ints ? Value::Int(a.i + b.i) : Value::Float(x + y);
    if (op == "-") return ints ? Value::Int(a.i - b.i) : Value::Float(x - y);
    if (op == "*") return ints ? Value::Int(a.i * b.i) : Value::Float(x * y);
    if (y == 0) return Error(e.line, "division by zero");
    if (op == "/") return Value::Float(x / y);
    if (op == "//") {
      if (!ints) return Value::Float(std::floor(x / y));
      std::int64_t q = a.i / b.i;
      if ((a.i % b.i != 0) && ((a.i < 0) != (b.i < 0))) --q;
      return Value::Int(q);
    }
    if (op == "%") {
      if (!ints) return Value::Float(x - y * std::floor(x / y));
      std::int64_t r = a.i % b.i;
      if (r != 0 && ((r < 0) != (b.i < 0))) r += b.i;
      return Value::Int(r);
    }
    if (op == "**") {
      const double p = std::pow(x, y);
      if (!std::isfinite(p) || std::fabs(p) > 9e18) return Error(e.line, "power out of range");
      return ints && b.i >= 0 ? Value::Int(static_cast<std::int64_t>(p)) : Value::Float(p);
    }
    return Error(e.line, "unknown operator '" + op + "'");
  }

  const RenderLimits& limits_;
  std::vector<Object> frames_;
  std::string out_;
  std::int64_t steps_ = 0;
};

}  // namespace

Result<std::string> Render(const Body& body,
                           const std::vector<std::pair<std::string, Value>>& globals,
                           const RenderLimits& limits) {
  Renderer r(limits);
  return r.Run(body, globals);
}

}  // namespace lockstep::jinja
