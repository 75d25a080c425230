// The one Markdown -> HTML converter (markdown_html.h). It was two: the comparator's (backslash
// escapes, literal code spans, trimmed cells, "\|" in cells) and the campaign report's (headings);
// this is the first with the second's headings.
#include "lockstep/compare/markdown_html.h"

#include <cctype>
#include <optional>
#include <utility>
#include <vector>

#include "lockstep/compare/report.h"

namespace lockstep {
namespace {

// A link target the converter accepts: a relative path of [A-Za-z0-9._/-] that neither starts
// with '/' nor climbs with "..", so a link can only point at a sibling file of the report.
bool SafeHref(std::string_view h) {
  if (h.empty() || h.front() == '/' || h.find("..") != std::string_view::npos) return false;
  for (char c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '/' &&
        c != '-')
      return false;
  return true;
}

std::string InlineHtml(std::string_view s);

// "[text](href)" at s[i] with a SafeHref target: the <a> element and the index of its ')'.
std::optional<std::pair<std::string, std::size_t>> Link(std::string_view s, std::size_t i) {
  const std::size_t close = s.find("](", i);
  if (close == std::string_view::npos) return std::nullopt;
  const std::size_t end = s.find(')', close + 2);
  if (end == std::string_view::npos) return std::nullopt;
  const std::string_view text = s.substr(i + 1, close - i - 1),
                         href = s.substr(close + 2, end - close - 2);
  if (text.empty() || text.find('[') != std::string_view::npos || !SafeHref(href))
    return std::nullopt;
  return std::make_pair("<a href=\"" + HtmlEscape(href) + "\">" + InlineHtml(text) + "</a>", end);
}

// Inline markup: backslash escapes, `code`, **strong**, [text](relative path); everything else
// HTML-escaped.
std::string InlineHtml(std::string_view s) {
  std::string out;
  bool strong = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '[') {
      if (auto link = Link(s, i)) {
        out += link->first;
        i = link->second;
        continue;
      }
      out += '[';
    } else if (c == '\\' && i + 1 < s.size() &&
               std::ispunct(static_cast<unsigned char>(s[i + 1]))) {
      out += HtmlEscape(s.substr(++i, 1));
    } else if (c == '`') {
      const std::size_t e = s.find('`', i + 1);
      if (e == std::string_view::npos) {
        out += HtmlEscape("`");
        continue;
      }
      out += "<code>" + HtmlEscape(s.substr(i + 1, e - i - 1)) + "</code>";
      i = e;
    } else if (c == '*' && i + 1 < s.size() && s[i + 1] == '*') {
      out += strong ? "</strong>" : "<strong>";
      strong = !strong;
      ++i;
    } else {
      out += HtmlEscape(s.substr(i, 1));
    }
  }
  if (strong) out += "</strong>";
  return out;
}

// The cells of a "| a | b |" row, trimmed; "\|" stays in the cell (InlineHtml unescapes it).
std::vector<std::string> TableCells(std::string_view line) {
  std::vector<std::string> cells;
  std::string cur;
  for (std::size_t i = 1; i < line.size(); ++i) {  // skip the leading '|'
    if (line[i] == '\\' && i + 1 < line.size()) {
      cur += line.substr(i, 2);
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(cur);
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  for (std::string& c : cells) {
    const auto b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
    c = b == std::string::npos ? std::string() : c.substr(b, e - b + 1);
  }
  return cells;
}

// 1..6 for "# " .. "###### ", else 0.
int HeadingLevel(std::string_view line) {
  std::size_t n = 0;
  while (n < line.size() && n < 7 && line[n] == '#') ++n;
  return n >= 1 && n <= 6 && n < line.size() && line[n] == ' ' ? static_cast<int>(n) : 0;
}

}  // namespace

std::string MarkdownToHtml(std::string_view md) {
  std::string html, para, quote;
  bool in_list = false;
  int table_row = -1;  // -1: not in a table
  auto close = [&] {
    if (!para.empty()) html += "<p>" + InlineHtml(para) + "</p>\n";
    para.clear();
    // A quote's lines, their "> " removed, are a document of their own.
    if (!quote.empty()) html += "<blockquote>\n" + MarkdownToHtml(quote) + "</blockquote>\n";
    quote.clear();
    if (in_list) html += "</ul>\n";
    in_list = false;
    if (table_row >= 0) html += "</tbody></table>\n";
    table_row = -1;
  };
  std::size_t pos = 0;
  while (pos <= md.size()) {
    std::size_t e = md.find('\n', pos);
    if (e == std::string_view::npos) e = md.size();
    const std::string_view line = md.substr(pos, e - pos);
    pos = e + 1;
    if (line.starts_with(">") && (line.size() == 1 || line[1] == ' ')) {
      if (quote.empty()) close();
      quote += std::string(line.substr(line.size() > 1 ? 2 : 1)) + "\n";
    } else if (line.empty()) {
      close();
    } else if (!quote.empty()) {
      close();
      pos -= line.size() + 1;  // the line after a quote starts the next block: read it again
      continue;
    } else if (const int level = HeadingLevel(line); level > 0) {
      close();
      const std::string tag = "h" + std::to_string(level);
      html += "<" + tag + ">" + InlineHtml(line.substr(static_cast<std::size_t>(level) + 1)) +
              "</" + tag + ">\n";
    } else if (line.starts_with("- ")) {
      if (!in_list) {
        close();
        html += "<ul>\n";
        in_list = true;
      }
      html += "<li>" + InlineHtml(line.substr(2)) + "</li>\n";
    } else if (line.starts_with("|")) {
      if (table_row < 0) {
        close();
        html += "<table>\n";
        table_row = 0;
      }
      if (line.starts_with("|---")) continue;  // header separator
      const bool head = table_row == 0;
      html += head ? "<thead><tr>" : "<tr>";
      for (const std::string& c : TableCells(line))
        html += (head ? "<th>" : "<td>") + InlineHtml(c) + (head ? "</th>" : "</td>");
      html += head ? "</tr></thead><tbody>\n" : "</tr>\n";
      ++table_row;
    } else {
      if (in_list || table_row >= 0) close();
      if (!para.empty()) para += ' ';
      para += line;
    }
  }
  close();
  return html;
}

const char* ReportStylesheet() {
  return R"(body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.2em auto;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin:.6em 0 .3em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
h3{font-size:1.05em}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ccc;padding:.2em .6em;text-align:left}
th{background:#f3f3f3}code{background:#f4f4f4;padding:0 .2em}svg{display:block;margin:.8em 0;max-width:100%;height:auto}
blockquote{border-left:4px solid #ccc;margin:.6em 0;padding:.1em 1em;background:#fafafa}
.verdict{border:2px solid;border-radius:6px;padding:.5em 1em;margin:.4em 0 1em}
.verdict .word{font-size:1.6em;font-weight:700;letter-spacing:.04em;margin:.1em 0}
.verdict p,.verdict ul{margin:.3em 0}
.verdict-pass{border-color:#1a7f37;background:#dafbe1}.verdict-pass .word{color:#116329}
.verdict-fail{border-color:#cf222e;background:#ffebe9}.verdict-fail .word{color:#a40e26}
.verdict-warn{border-color:#bf8700;background:#fff8c5}.verdict-warn .word{color:#7d4e00}
td.pass,span.pass{color:#116329;font-weight:600}td.fail,span.fail{color:#a40e26;font-weight:600}
td.expected,span.expected{color:#0550ae;font-weight:600}
)";
}

std::string HtmlDocument(std::string_view title, std::string_view body) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
         HtmlEscape(title) + "</title>\n<style>\n" + ReportStylesheet() +
         "</style>\n</head>\n<body>\n" + std::string(body) + "</body>\n</html>\n";
}

}  // namespace lockstep
