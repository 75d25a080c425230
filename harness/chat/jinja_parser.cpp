#include "chat/jinja_parser.h"

#include <cstring>

namespace lockstep::jinja {

namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Hugging Face's environment before lexing: one trailing newline dropped, lstrip_blocks (spaces
// and tabs before a block or comment at the start of a line), trim_blocks (the newline after a
// block or comment), `{% generation %}` / `{% endgeneration %}` removed with their whitespace
// control.
std::string Preprocess(std::string_view in) {
  if (!in.empty() && in.back() == '\n') in.remove_suffix(1);
  std::string a;
  a.reserve(in.size());
  for (std::size_t k = 0; k < in.size();) {
    if (k == 0 || in[k - 1] == '\n') {
      std::size_t e = k;
      while (e < in.size() && (in[e] == ' ' || in[e] == '\t')) ++e;
      if (e + 1 < in.size() && in[e] == '{' && std::strchr("#%-", in[e + 1]) != nullptr &&
          in[e + 1] != '\0')
        k = e;
    }
    a += in[k++];
  }
  std::string b;
  b.reserve(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    b += a[k];
    if (a[k] == '}' && k > 0 && std::strchr("#%-", a[k - 1]) != nullptr && a[k - 1] != '\0' &&
        k + 1 < a.size() && a[k + 1] == '\n' && b.size() >= 2)
      ++k;  // trim_blocks
  }
  std::string c;
  c.reserve(b.size());
  for (std::size_t k = 0; k < b.size();) {
    if (b.compare(k, 2, "{%") == 0) {
      std::size_t p = k + 2;
      const bool lstrip = p < b.size() && b[p] == '-';
      if (lstrip) ++p;
      while (p < b.size() && IsSpace(b[p])) ++p;
      if (b.compare(p, 3, "end") == 0) p += 3;
      if (b.compare(p, 10, "generation") == 0) {
        p += 10;
        while (p < b.size() && IsSpace(b[p])) ++p;
        const bool rstrip = p < b.size() && b[p] == '-';
        if (rstrip) ++p;
        if (b.compare(p, 2, "%}") == 0) {
          p += 2;
          if (lstrip)
            while (!c.empty() && IsSpace(c.back())) c.pop_back();
          if (rstrip)
            while (p < b.size() && IsSpace(b[p])) ++p;
          k = p;
          continue;
        }
      }
    }
    c += b[k++];
  }
  return c;
}

struct Token {
  enum class Kind { kText, kOpenExpr, kCloseExpr, kOpenStmt, kCloseStmt, kName, kString, kInt,
                    kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
  std::int64_t i = 0;
  double f = 0;
  int line = 1;
};

void AppendUtf8(std::uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  Result<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      std::size_t open = src_.find('{', pos_);
      while (open != std::string::npos && open + 1 < src_.size() &&
             std::strchr("{%#", src_[open + 1]) == nullptr)
        open = src_.find('{', open + 1);
      if (open == std::string::npos || open + 1 >= src_.size()) open = src_.size();
      if (open > pos_) Push(Token::Kind::kText, src_.substr(pos_, open - pos_));
      Advance(open);
      if (pos_ >= src_.size()) break;
      const char kind = src_[pos_ + 1];
      const bool strip_before = pos_ + 2 < src_.size() && src_[pos_ + 2] == '-';
      if (strip_before) StripLastText();
      Advance(pos_ + 2 + (strip_before ? 1 : 0));
      if (kind == '#') {
        const std::size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) return Error("missing end of comment tag");
        const bool strip_after = end > pos_ && src_[end - 1] == '-';
        Advance(end + 2);
        if (strip_after) SkipSpace();
        continue;
      }
      Push(kind == '{' ? Token::Kind::kOpenExpr : Token::Kind::kOpenStmt, "");
      LOCKSTEP_RETURN_IF_ERROR(Tag(kind == '{'));
    }
    Push(Token::Kind::kEnd, "");
    return std::move(tokens_);
  }

 private:
  Status Error(std::string_view what) const {
    return Status::InvalidArgument("chat template: " + std::string(what) + " at line " +
                                   std::to_string(line_));
  }
  void Advance(std::size_t to) {
    for (; pos_ < to && pos_ < src_.size(); ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }
  void SkipSpace() {
    while (pos_ < src_.size() && IsSpace(src_[pos_])) Advance(pos_ + 1);
  }
  void Push(Token::Kind k, std::string text) {
    Token t;
    t.kind = k;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }
  void StripLastText() {
    if (tokens_.empty() || tokens_.back().kind != Token::Kind::kText) return;
    std::string& s = tokens_.back().text;
    while (!s.empty() && IsSpace(s.back())) s.pop_back();
    if (s.empty()) tokens_.pop_back();
  }

  // The tokens of one tag, through its closing `}}` / `%}` (with `-`: the whitespace after it
  // skipped).
  Status Tag(bool expr) {
    int braces = 0;
    for (;;) {
      SkipSpace();
      if (pos_ >= src_.size()) return Error(expr ? "missing '}}'" : "missing '%}'");
      const char c = src_[pos_];
      const std::string_view rest(src_.data() + pos_, src_.size() - pos_);
      const std::string_view close = expr ? "}}" : "%}";
      const bool strip = c == '-' && rest.substr(1, 2) == close;
      if ((rest.substr(0, 2) == close && (!expr || braces == 0)) || strip) {
        Advance(pos_ + 2 + (strip ? 1 : 0));
        Push(expr ? Token::Kind::kCloseExpr : Token::Kind::kCloseStmt, "");
        if (strip) SkipSpace();
        return Status::Ok();
      }
      if (c == '\'' || c == '"') {
        LOCKSTEP_RETURN_IF_ERROR(String(c));
        continue;
      }
      if (IsDigit(c)) {
        std::size_t e = pos_;
        while (e < src_.size() && IsDigit(src_[e])) ++e;
        const bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOp &&
                               tokens_.back().text == ".";
        if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
          ++e;
          while (e < src_.size() && IsDigit(src_[e])) ++e;
          Push(Token::Kind::kFloat, src_.substr(pos_, e - pos_));
          tokens_.back().f = std::strtod(tokens_.back().text.c_str(), nullptr);
        } else {
          if (e - pos_ > 18) return Error("integer literal too long");
          Push(Token::Kind::kInt, src_.substr(pos_, e - pos_));
          tokens_.back().i = std::stoll(tokens_.back().text);
        }
        Advance(e);
        continue;
      }
      if (IsNameStart(c)) {
        std::size_t e = pos_;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        Push(Token::Kind::kName, src_.substr(pos_, e - pos_));
        Advance(e);
        continue;
      }
      static constexpr const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[",
                                             "]",  "{",  "}",  ",",  ".",  ":",  "|", "~", "+",
                                             "-",  "*",  "/",  "%",  "<",  ">",  "="};
      bool found = false;
      for (const char* op : kOps) {
        if (rest.substr(0, std::strlen(op)) != op) continue;
        if (op[0] == '{' && op[1] == '\0') ++braces;
        if (op[0] == '}' && op[1] == '\0') --braces;
        Push(Token::Kind::kOp, op);
        Advance(pos_ + std::strlen(op));
        found = true;
        break;
      }
      if (!found) return Error(std::string("unexpected character '") + c + "'");
    }
  }

  Status String(char quote) {
    std::string s;
    std::size_t p = pos_ + 1;
    for (;;) {
      if (p >= src_.size()) return Error("unterminated string");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        s += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return Error("unterminated string");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          s += '\n';
          break;
        case 't':
          s += '\t';
          break;
        case 'r':
          s += '\r';
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'v':
          s += '\v';
          break;
        case '\'':
        case '"':
        case '\\':
          s += e;
          break;
        case 'x':
        case 'u': {
          const std::size_t n = e == 'x' ? 2 : 4;
          if (p + n > src_.size()) return Error("invalid escape");
          std::uint32_t cp = 0;
          for (std::size_t k = 0; k < n; ++k) {
            const char h = src_[p + k];
            int d = IsDigit(h) ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
            if (d < 0) return Error("invalid escape");
            cp = cp * 16 + static_cast<std::uint32_t>(d);
          }
          p += n;
          AppendUtf8(cp, s);
          break;
        }
        default:
          return Error(std::string("unknown escape '\\") + e + "'");
      }
    }
    Push(Token::Kind::kString, std::move(s));
    Advance(p + 1);
    return Status::Ok();
  }

  std::string src_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth)
      : t_(std::move(tokens)), max_depth_(max_depth) {}

  Result<Body> Run() {
    Body body;
    std::string end;
    LOCKSTEP_RETURN_IF_ERROR(ParseBody(body, {}, end));
    if (!end.empty()) return Error("unexpected '" + end + "'");
    return body;
  }

 private:
  using K = Token::Kind;
  const Token& Peek(std::size_t ahead = 0) const {
    return t_[std::min(p_ + ahead, t_.size() - 1)];
  }
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
  Lexer lexer(Preprocess(source));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens), max_depth);
  return parser.Run();
}

}  // namespace lockstep::jinja
