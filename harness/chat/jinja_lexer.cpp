#include "chat/jinja_lexer.h"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace lockstep::jinja {

namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
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
            int d = IsDigit(h)               ? h - '0'
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

}  // namespace

Result<std::vector<Token>> Lex(std::string_view source) {
  Lexer lexer(Preprocess(source));
  return lexer.Run();
}

}  // namespace lockstep::jinja
