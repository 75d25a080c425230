// Markdown -> HTML for the documents lockstep writes itself (the comparator's report, the
// campaign's report). Not a CommonMark implementation: it knows the subset those writers emit,
// and escapes everything else, so text from outside (arm names, reasons, gate messages) can never
// become markup.
//
// Blocks, one per line kind (a blank line ends any block):
//   "# T" .. "###### T"   <hN>T</hN>
//   "- item"              <ul><li>item</li>...</ul> (consecutive items)
//   "| a | b |"           <table>: the first row is <thead>, a "|---" row is skipped, the rest
//                         are <tbody> rows; cells are trimmed, and "\|" is a '|' inside a cell
//   anything else         <p>: consecutive lines joined with one space
// Inline, inside every block:
//   "\X"                  X literally, for any ASCII punctuation X (Markdown's backslash escape)
//   "`code`"              <code>code</code>, its content literal (no escapes, no markup inside);
//                         a backtick without a closing one stays a backtick
//   "**strong**"          <strong>strong</strong>; one left open is closed at the end of its block
// Everything else is HTML-escaped (& < > " ' as HtmlEscape); there are no links, images, raw HTML
// or single-'*' emphasis. Pure function, thread-compatible.
#pragma once

#include <string>
#include <string_view>

namespace lockstep {

std::string MarkdownToHtml(std::string_view md);

}  // namespace lockstep
