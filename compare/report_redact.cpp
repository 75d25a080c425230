// Redaction and the forbidden-text scan (report.h FindForbiddenText): what an allowlisted report
// must never contain (paths, the host name, the account names), found the same way for the check
// and for Redact(), which every outside string passes on its way into a report.
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/compare/report.h"
#include "report_util.h"

namespace lockstep {
namespace {

// ---- forbidden text (shared by FindForbiddenText and Redact) ----

struct Span {
  std::size_t begin, end;
};

bool IsAlnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool IsPathChar(char c) {
  return IsAlnum(c) || std::string_view("_.-/~+@%").find(c) != std::string_view::npos;
}
// A '/' starts an absolute path only after something that cannot be part of a word or a tag:
// "p/T", "1/2", "A/A" (letter/digit before) and "</svg>" ('<' before) are not paths.
bool PathStartBoundary(char c) { return !IsPathChar(c) && c != '<' && c != '\\'; }

std::string Lower(std::string_view s) {
  std::string t(s);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

// Host and account names of this process (each read once; names of 2 characters or fewer are
// too common as substrings to search for).
const std::vector<std::string>& LocalIdentities() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    auto add = [&v](std::string s) {
      if (s.size() > 2 && std::find(v.begin(), v.end(), Lower(s)) == v.end()) v.push_back(Lower(s));
    };
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) == 0) {
      const std::string host(buf);
      add(host);
      add(host.substr(0, host.find('.')));  // short name
    }
    char login[256] = {};
    if (getlogin_r(login, sizeof(login)) == 0) add(login);
    if (const char* user = std::getenv("USER")) add(user);  // env: USER
    if (const passwd* pw = getpwuid(geteuid())) add(pw->pw_name);
    return v;
  }();
  return names;
}

void FindPathSpans(std::string_view t, std::vector<Span>& out) {
  auto token_end = [&t](std::size_t i) {
    while (i < t.size() && IsPathChar(t[i])) ++i;
    return i;
  };
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '/' && (i == 0 || PathStartBoundary(t[i - 1]))) {
      const std::size_t e = token_end(i);
      std::size_t k = i;
      while (k < e && t[k] == '/') ++k;
      // "/a/..." or "//host/...": a non-empty segment followed by another separator.
      const std::size_t next = t.substr(k, e - k).find('/');
      if (k < e && next != std::string_view::npos && next > 0) {
        out.push_back({i, e});
        i = e;
      }
    } else if (c == '~' && i + 1 < t.size() && t[i + 1] == '/') {
      out.push_back({i, token_end(i)});
    } else if (IsAlnum(c) && i + 2 < t.size() && t[i + 1] == ':' && t[i + 2] == '\\' &&
               (i == 0 || !IsAlnum(t[i - 1]))) {  // "C:\..."
      std::size_t e = i + 3;
      while (e < t.size() && (IsPathChar(t[e]) || t[e] == '\\')) ++e;
      out.push_back({i, e});
    } else if (c == '\\' && i + 2 < t.size() && t[i + 1] == '\\' &&
               IsAlnum(t[i + 2])) {  // "\\server\share"
      std::size_t e = i + 2;
      while (e < t.size() && (IsPathChar(t[e]) || t[e] == '\\')) ++e;
      out.push_back({i, e});
    }
  }
  // Well-known roots anywhere, even glued to a word ("x/home/alice" is still a home folder).
  for (std::string_view root :
       {"/home/", "/tmp/", "/work/", "/usr/", "/var/", "/root/", "/Users/", "/mnt/", "/opt/"}) {
    for (std::size_t p = t.find(root); p != std::string_view::npos; p = t.find(root, p + 1))
      out.push_back({p, token_end(p)});
  }
}

std::vector<Span> ForbiddenSpans(std::string_view text, const std::vector<std::string>& extra) {
  std::vector<Span> spans;
  FindPathSpans(text, spans);
  const std::string lower = Lower(text);
  for (const std::string& name : LocalIdentities()) {
    for (std::size_t p = lower.find(name); p != std::string::npos; p = lower.find(name, p + 1)) {
      const std::size_t e = p + name.size();
      // Whole words only: a host called "dev" must not flag "device", and a user called "root"
      // must not flag the hyphenated word "root-cause".
      auto word_edge = [&lower](std::size_t i) { return !IsAlnum(lower[i]) && lower[i] != '-'; };
      if ((p == 0 || word_edge(p - 1)) && (e == lower.size() || word_edge(e)))
        spans.push_back({p, e});
    }
  }
  for (const std::string& s : extra) {
    if (s.empty()) continue;
    for (std::size_t p = text.find(s); p != std::string_view::npos; p = text.find(s, p + 1))
      spans.push_back({p, p + s.size()});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  return spans;
}

}  // namespace

// Free text that came from an export (reasons, unknowns, stop reasons) with anything forbidden
// replaced: the reports are allowlisted even when an input string is not.
std::string report_internal::Redact(std::string_view text) {
  const std::vector<Span> spans = ForbiddenSpans(text, {});
  if (spans.empty()) return std::string(text);
  std::string out;
  std::size_t pos = 0;
  for (const Span& s : spans) {
    if (s.begin < pos) {  // overlaps the previous span (a host name inside a path): widen it
      pos = std::max(pos, s.end);
      continue;
    }
    out.append(text.substr(pos, s.begin - pos));
    out += "(redacted)";
    pos = s.end;
  }
  out.append(text.substr(pos));
  return out;
}

std::vector<std::string> FindForbiddenText(const std::string& text,
                                           const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  for (const Span& s : ForbiddenSpans(text, extra)) {
    // A little context on each side, so the caller can see where it sits.
    const std::size_t b = s.begin >= 16 ? s.begin - 16 : 0;
    const std::size_t e = std::min(text.size(), s.end + 16);
    std::string snippet = text.substr(b, e - b);
    std::replace(snippet.begin(), snippet.end(), '\n', ' ');
    if (std::find(out.begin(), out.end(), snippet) == out.end()) out.push_back(std::move(snippet));
  }
  return out;
}

}  // namespace lockstep
