// The one Markdown -> HTML converter (markdown_html.h). It was two: the comparator's (backslash
// escapes, literal code spans, trimmed cells, "\|" in cells) and the campaign report's (headings);
// this is the first with the second's headings.
#include "lockstep/compare/markdown_html.h"

#include <cctype>
#include <vector>

#include "lockstep/compare/report.h"

namespace lockstep {
namespace {

// Inline markup: backslash escapes, `code`, **strong**; everything else HTML-escaped.
std::string InlineHtml(std::string_view s) {
  std::string out;
  bool strong = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\' && i + 1 < s.size() && std::ispunct(static_cast<unsigned char>(s[i + 1]))) {
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
  std::string html, para;
  bool in_list = false;
  int table_row = -1;  // -1: not in a table
  auto close = [&] {
    if (!para.empty()) html += "<p>" + InlineHtml(para) + "</p>\n";
    para.clear();
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
    if (line.empty()) {
      close();
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

}  // namespace lockstep
