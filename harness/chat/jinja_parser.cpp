#include "chat/jinja_parser.h"

#include <utility>

#include "chat/jinja_lexer.h"

namespace lockstep::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth) : t_(std::move(tokens)), max_depth_(max_depth) {}

  Result<Body> Run() {
    Body body;
    std::string end;
    LOCKSTEP_RETURN_IF_ERROR(ParseBody(body, {}, end));
    if (!end.empty()) return Error("unexpected '" + end + "'");
    return body;
  }

 private:
  using K = Token::Kind;
  const Token& Peek(std::size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool IsOp(std::string_view op, std::size_t ahead = 0) const {
    return Peek(ahead).kind == K::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view n, std::size_t ahead = 0) const {
    return Peek(ahead).kind == K::kName && Peek(ahead).text == n;
  }
  Status Error(std::string_view what) const {
    return Status::InvalidArgument("chat template: " + std::string(what) + " at line " +
                                   std::to_string(Peek().line));
  }
  Status Expect(std::string_view op) {
    if (!IsOp(op)) return Error("expected '" + std::string(op) + "'");
    ++p_;
    return Status::Ok();
  }
  Status ExpectClose() {
    if (Peek().kind != K::kCloseStmt) return Error("expected '%}'");
    ++p_;
    return Status::Ok();
  }
  Result<std::string> Name() {
    if (Peek().kind != K::kName) return Error("expected a name");
    return t_[p_++].text;
  }
  static ExprPtr Node(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Statements until one of `ends` (its keyword in `end`, the `{%` and keyword consumed) or the
  // end of the template (`end` empty).
  Status ParseBody(Body& body, std::initializer_list<std::string_view> ends, std::string& end) {
    if (++depth_ > max_depth_) return Error("blocks nested too deeply");
    for (;;) {
      const Token& tok = Peek();
      if (tok.kind == K::kEnd) {
        end.clear();
        break;
      }
      if (tok.kind == K::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->text = tok.text;
        body.push_back(std::move(s));
        ++p_;
        continue;
      }
      if (tok.kind == K::kOpenExpr) {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = tok.line;
        LOCKSTEP_ASSIGN_OR_RETURN(s->expr, ParseExpr(true));
        if (Peek().kind != K::kCloseExpr) return Error("expected '}}'");
        ++p_;
        body.push_back(std::move(s));
        continue;
      }
      if (tok.kind != K::kOpenStmt) return Error("unexpected token");
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(std::string kw, Name());
      bool is_end = false;
      for (std::string_view e : ends) is_end = is_end || e == kw;
      if (is_end) {
        end = kw;
        break;
      }
      LOCKSTEP_RETURN_IF_ERROR(ParseStatement(kw, body));
    }
    --depth_;
    return Status::Ok();
  }

  Status ParseStatement(const std::string& kw, Body& body) {
    const int line = Peek().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (kw == "if") {
      LOCKSTEP_RETURN_IF_ERROR(ParseIf(*s));
    } else if (kw == "for") {
      s->kind = Stmt::Kind::kFor;
      do {
        LOCKSTEP_ASSIGN_OR_RETURN(std::string n, Name());
        s->targets.push_back(std::move(n));
      } while (IsOp(",") && (++p_, true));
      if (!IsName("in")) return Error("expected 'in'");
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(s->expr, ParseExpr(false));
      if (IsName("if")) {
        ++p_;
        LOCKSTEP_ASSIGN_OR_RETURN(s->filter, ParseExpr(false));
      }
      LOCKSTEP_RETURN_IF_ERROR(ExpectClose());
      std::string end;
      LOCKSTEP_RETURN_IF_ERROR(ParseBody(s->body, {"endfor", "else"}, end));
      if (end.empty()) return Error("missing '{% endfor %}'");
      if (end == "else") {
        LOCKSTEP_RETURN_IF_ERROR(ExpectClose());
        LOCKSTEP_RETURN_IF_ERROR(ParseBody(s->else_body, {"endfor"}, end));
        if (end.empty()) return Error("missing '{% endfor %}'");
      }
      LOCKSTEP_RETURN_IF_ERROR(ExpectClose());
    } else if (kw == "set") {
      s->kind = Stmt::Kind::kSet;
      LOCKSTEP_ASSIGN_OR_RETURN(std::string n, Name());
      s->targets.push_back(std::move(n));
      if (IsOp(".")) {
        ++p_;
        LOCKSTEP_ASSIGN_OR_RETURN(s->attr, Name());
      }
      if (!IsOp("=")) return Error("'{% set %}' needs '= value' (block set is not supported)");
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(s->expr, ParseExpr(true));
      LOCKSTEP_RETURN_IF_ERROR(ExpectClose());
    } else {
      return Status::NotSupported("chat template: unsupported tag '" + kw + "' at line " +
                                  std::to_string(line));
    }
    body.push_back(std::move(s));
    return Status::Ok();
  }

  // After `{% if` / `{% elif`: condition, body, then elif (nested as the else body), else, endif.
  Status ParseIf(Stmt& s) {
    s.kind = Stmt::Kind::kIf;
    LOCKSTEP_ASSIGN_OR_RETURN(s.expr, ParseExpr(true));
    LOCKSTEP_RETURN_IF_ERROR(ExpectClose());
    std::string end;
    LOCKSTEP_RETURN_IF_ERROR(ParseBody(s.body, {"elif", "else", "endif"}, end));
    if (end.empty()) return Error("missing '{% endif %}'");
    if (end == "elif") {
      auto inner = std::make_unique<Stmt>();
      inner->line = Peek().line;
      if (++depth_ > max_depth_) return Error("blocks nested too deeply");
      LOCKSTEP_RETURN_IF_ERROR(ParseIf(*inner));
      --depth_;
      s.else_body.push_back(std::move(inner));
      return Status::Ok();  // the inner if consumed the endif
    }
    if (end == "else") {
      LOCKSTEP_RETURN_IF_ERROR(ExpectClose());
      LOCKSTEP_RETURN_IF_ERROR(ParseBody(s.else_body, {"endif"}, end));
      if (end.empty()) return Error("missing '{% endif %}'");
    }
    return ExpectClose();
  }

  struct DepthGuard {
    explicit DepthGuard(int& d) : d_(d) { ++d_; }
    ~DepthGuard() { --d_; }
    int& d_;
  };

  Result<ExprPtr> ParseExpr(bool with_cond) {
    DepthGuard g(depth_);
    if (depth_ > max_depth_) return Error("expression nested too deeply");
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (with_cond && IsName("if")) {
      const int line = Peek().line;
      ++p_;
      auto c = Node(Expr::Kind::kCond, line);
      c->args.push_back(std::move(e));
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      c->args.push_back(std::move(cond));
      if (IsName("else")) {
        ++p_;
        LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr other, ParseExpr(true));
        c->args.push_back(std::move(other));
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = Node(Expr::Kind::kBinary, a->line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  Result<ExprPtr> ParseOr() {
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    while (IsName("or")) {
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      e = Binary("or", std::move(e), std::move(r));
    }
    return e;
  }
  Result<ExprPtr> ParseAnd() {
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    while (IsName("and")) {
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      e = Binary("and", std::move(e), std::move(r));
    }
    return e;
  }
  Result<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard g(depth_);
      if (depth_ > max_depth_) return Error("expression nested too deeply");
      auto e = Node(Expr::Kind::kUnary, Peek().line);
      ++p_;
      e->name = "not";
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr x, ParseNot());
      e->args.push_back(std::move(x));
      return e;
    }
    return ParseCompare();
  }
  Result<ExprPtr> ParseCompare() {
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
    for (;;) {
      std::string op;
      if (Peek().kind == K::kOp &&
          (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">="))) {
        op = Peek().text;
        ++p_;
      } else if (IsName("in")) {
        op = "in";
        ++p_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        p_ += 2;
      } else {
        break;
      }
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
      e = Binary(op, std::move(e), std::move(r));
    }
    return e;
  }
  Result<ExprPtr> ParseMath1() {
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      std::string op = t_[p_++].text;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
      e = Binary(op, std::move(e), std::move(r));
    }
    return e;
  }
  Result<ExprPtr> ParseConcat() {
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseMath2());
    while (IsOp("~")) {
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr r, ParseMath2());
      e = Binary("~", std::move(e), std::move(r));
    }
    return e;
  }
  Result<ExprPtr> ParseMath2() {
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = t_[p_++].text;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr r, ParsePow());
      e = Binary(op, std::move(e), std::move(r));
    }
    return e;
  }
  Result<ExprPtr> ParsePow() {
    LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseUnary(true));
    while (IsOp("**")) {
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(true));
      e = Binary("**", std::move(e), std::move(r));
    }
    return e;
  }
  Result<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard g(depth_);
    if (depth_ > max_depth_) return Error("expression nested too deeply");
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Node(Expr::Kind::kUnary, Peek().line);
      e->name = t_[p_++].text;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr x, ParseUnary(false));
      e->args.push_back(std::move(x));
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(e, ParsePrimary());
      LOCKSTEP_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    }
    if (!with_filter) return e;
    for (;;) {
      if (IsOp("|")) {
        ++p_;
        auto f = Node(Expr::Kind::kFilter, Peek().line);
        LOCKSTEP_ASSIGN_OR_RETURN(f->name, Name());
        f->args.push_back(std::move(e));
        if (IsOp("(")) LOCKSTEP_RETURN_IF_ERROR(ParseArgs(*f));
        LOCKSTEP_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(f)));
      } else if (IsName("is")) {
        ++p_;
        auto t = Node(Expr::Kind::kTest, Peek().line);
        if (IsName("not")) {
          t->negate = true;
          ++p_;
        }
        LOCKSTEP_ASSIGN_OR_RETURN(t->name, Name());
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          LOCKSTEP_RETURN_IF_ERROR(ParseArgs(*t));
        } else if (Peek().kind == K::kString || Peek().kind == K::kInt ||
                   Peek().kind == K::kFloat) {
          LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  // `(a, b, k=v)` after a callee, filter or test name: positional into args, keywords kwargs.
  Status ParseArgs(Expr& call) {
    LOCKSTEP_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (Peek().kind == K::kName && IsOp("=", 1)) {
        std::string key = t_[p_].text;
        p_ += 2;
        LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr(true));
        call.kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!call.kwargs.empty()) return Error("positional argument after a keyword argument");
        LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr(true));
        call.args.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      ++p_;
    }
    return Expect(")");
  }

  Result<ExprPtr> ParsePostfix(ExprPtr e) {
    for (;;) {
      const int line = Peek().line;
      if (IsOp(".")) {
        ++p_;
        auto a = Node(Expr::Kind::kAttr, line);
        if (Peek().kind == K::kInt) {  // x.0 is x[0]
          a->kind = Expr::Kind::kIndex;
          a->args.push_back(std::move(e));
          auto idx = Node(Expr::Kind::kLiteral, line);
          idx->value = Value::Int(t_[p_++].i);
          a->args.push_back(std::move(idx));
        } else {
          LOCKSTEP_ASSIGN_OR_RETURN(a->name, Name());
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        ++p_;
        ExprPtr parts[3];
        int n_colons = 0;
        for (;;) {
          if (IsOp("]")) break;
          if (IsOp(":")) {
            if (++n_colons > 2) return Error("a slice takes at most 3 parts");
            ++p_;
            continue;
          }
          if (parts[n_colons]) return Error("expected ':' or ']'");
          LOCKSTEP_ASSIGN_OR_RETURN(parts[n_colons], ParseExpr(true));
        }
        ++p_;
        auto s = Node(n_colons ? Expr::Kind::kSlice : Expr::Kind::kIndex, line);
        s->args.push_back(std::move(e));
        if (n_colons == 0) {
          if (!parts[0]) return Error("empty subscript");
          s->args.push_back(std::move(parts[0]));
        } else {
          for (auto& part : parts) s->args.push_back(std::move(part));
        }
        e = std::move(s);
      } else if (IsOp("(")) {
        auto c = Node(Expr::Kind::kCall, line);
        c->args.push_back(std::move(e));
        LOCKSTEP_RETURN_IF_ERROR(ParseArgs(*c));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& tok = Peek();
    auto lit = Node(Expr::Kind::kLiteral, tok.line);
    switch (tok.kind) {
      case K::kString: {
        std::string s;
        while (Peek().kind == K::kString) s += t_[p_++].text;  // adjacent literals join
        lit->value = Value::Str(std::move(s));
        return lit;
      }
      case K::kInt:
        lit->value = Value::Int(tok.i);
        ++p_;
        return lit;
      case K::kFloat:
        lit->value = Value::Float(tok.f);
        ++p_;
        return lit;
      case K::kName: {
        ++p_;
        if (tok.text == "true" || tok.text == "True") {
          lit->value = Value::Bool(true);
        } else if (tok.text == "false" || tok.text == "False") {
          lit->value = Value::Bool(false);
        } else if (tok.text == "none" || tok.text == "None") {
          lit->value = Value::None();
        } else {
          lit->kind = Expr::Kind::kName;
          lit->name = tok.text;
        }
        return lit;
      }
      case K::kOp:
        break;
      default:
        return Error("expected an expression");
    }
    if (IsOp("(")) {
      ++p_;
      LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr(true));
      if (!IsOp(",")) {
        LOCKSTEP_RETURN_IF_ERROR(Expect(")"));
        return e;
      }
      lit->kind = Expr::Kind::kList;  // a tuple is a list here
      lit->args.push_back(std::move(e));
      while (IsOp(",")) {
        ++p_;
        if (IsOp(")")) break;
        LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr x, ParseExpr(true));
        lit->args.push_back(std::move(x));
      }
      LOCKSTEP_RETURN_IF_ERROR(Expect(")"));
      return lit;
    }
    if (IsOp("[")) {
      ++p_;
      lit->kind = Expr::Kind::kList;
      while (!IsOp("]")) {
        LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr x, ParseExpr(true));
        lit->args.push_back(std::move(x));
        if (!IsOp(",")) break;
        ++p_;
      }
      LOCKSTEP_RETURN_IF_ERROR(Expect("]"));
      return lit;
    }
    if (IsOp("{")) {
      ++p_;
      lit->kind = Expr::Kind::kDict;
      while (!IsOp("}")) {
        LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr k, ParseExpr(true));
        LOCKSTEP_RETURN_IF_ERROR(Expect(":"));
        LOCKSTEP_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr(true));
        lit->args.push_back(std::move(k));
        lit->args.push_back(std::move(v));
        if (!IsOp(",")) break;
        ++p_;
      }
      LOCKSTEP_RETURN_IF_ERROR(Expect("}"));
      return lit;
    }
    return Error("unexpected '" + tok.text + "'");
  }

  std::vector<Token> t_;
  std::size_t p_ = 0;
  int depth_ = 0;
  int max_depth_;
};

}  // namespace

Result<Body> ParseTemplate(std::string_view source, int max_depth) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  Parser parser(std::move(tokens), max_depth);
  return parser.Run();
}

}  // namespace lockstep::jinja
