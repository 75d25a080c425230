// Markdown -> HTML for the documents lockstep writes itself (the comparator's report, the
// campaign's report). Not a CommonMark implementation: it knows the subset those writers emit,
// and escapes everything else, so text from outside (arm names, reasons, gate messages) can never
// become markup.
//
// Blocks, one per line kind (a blank line ends any block):
//   "# T" .. "###### T"   <hN>T</hN>
//   "- item"              <ul><li>item</li>...</ul> (consecutive items)
//   "> text"              <blockquote>: consecutive "> " lines (and lone ">"), their prefix
//                         removed, converted as a document of their own
//   "| a | b |"           <table>: the first row is <thead>, a "|---" row is skipped, the rest
//                         are <tbody> rows; cells are trimmed, and "\|" is a '|' inside a cell
//   anything else         <p>: consecutive lines joined with one space
// Inline, inside every block:
//   "\X"                  X literally, for any ASCII punctuation X (Markdown's backslash escape)
//   "`code`"              <code>code</code>, its content literal (no escapes, no markup inside);
//                         a backtick without a closing one stays a backtick
//   "**strong**"          <strong>strong</strong>; one left open is closed at the end of its block
//   "[text](href)"        <a href="href">text</a> only when href is a relative path of
//                         [A-Za-z0-9._/-] that does not start with '/' and holds no ".." (a
//                         sibling file of the report: the campaign's per-pair pages); any other
//                         '[' stays literal
// Everything else is HTML-escaped (& < > " ' as HtmlEscape); there are no images, raw HTML,
// external links or single-'*' emphasis. Pure function, thread-compatible.
#pragma once

#include <string>
#include <string_view>

namespace lockstep {

std::string MarkdownToHtml(std::string_view md);

// The one stylesheet of every HTML report (diff, align, summarize, campaign): layout, tables and
// the verdict box's colours (.verdict-pass green, .verdict-fail red, .verdict-warn amber).
const char* ReportStylesheet();
// A whole self-contained page: doctype, <title> (escaped), the stylesheet inline, `body` as given
// (already HTML). No scripts, no external references.
std::string HtmlDocument(std::string_view title, std::string_view body);

}  // namespace lockstep
