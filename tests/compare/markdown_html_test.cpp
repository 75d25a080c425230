// Tests for compare/markdown_html.{h,cpp}: the one Markdown -> HTML converter of the comparator's
// and the campaign's reports. Escapes first (backslash escapes, HTML's five specials, pipes in
// table cells, code spans), then the blocks both reports rely on (headings, paragraphs, lists,
// tables, strong).
#include "lockstep/compare/markdown_html.h"

#include <gtest/gtest.h>

#include <string>

namespace lockstep {
namespace {

// ---- escapes ----

TEST(MarkdownHtml, BackslashEscapesAreTakenLiterally) {
  // Each escaped character is itself, HTML-escaped where it must be, and starts no markup.
  EXPECT_EQ(MarkdownToHtml("\\*\\*not strong\\*\\*"), "<p>**not strong**</p>\n");
  EXPECT_EQ(MarkdownToHtml("\\`not code\\`"), "<p>`not code`</p>\n");
  EXPECT_EQ(MarkdownToHtml("\\<script\\>"), "<p>&lt;script&gt;</p>\n");
  EXPECT_EQ(MarkdownToHtml("a \\& b \\# c \\[d\\]"), "<p>a &amp; b # c [d]</p>\n");
  EXPECT_EQ(MarkdownToHtml("back\\\\slash"), "<p>back\\slash</p>\n");
  // Not before punctuation, or at the very end: the backslash stays.
  EXPECT_EQ(MarkdownToHtml("C:\\dir x\\"), "<p>C:\\dir x\\</p>\n");
  // An escaped "- " or "# " at a line start is text, not a list or a heading.
  EXPECT_EQ(MarkdownToHtml("\\- not a list"), "<p>- not a list</p>\n");
  EXPECT_EQ(MarkdownToHtml("\\# not a heading"), "<p># not a heading</p>\n");
}

TEST(MarkdownHtml, HtmlSpecialsAreEscapedEverywhere) {
  const std::string hostile = "<b>&\"'</b>";
  const std::string escaped = "&lt;b&gt;&amp;&quot;&#39;&lt;/b&gt;";
  EXPECT_EQ(MarkdownToHtml(hostile), "<p>" + escaped + "</p>\n");
  EXPECT_EQ(MarkdownToHtml("# " + hostile), "<h1>" + escaped + "</h1>\n");
  EXPECT_EQ(MarkdownToHtml("- " + hostile), "<ul>\n<li>" + escaped + "</li>\n</ul>\n");
  EXPECT_EQ(MarkdownToHtml("| " + hostile + " |"),
            "<table>\n<thead><tr><th>" + escaped + "</th></tr></thead><tbody>\n</tbody></table>\n");
  EXPECT_EQ(MarkdownToHtml("`" + hostile + "`"), "<p><code>" + escaped + "</code></p>\n");
}

TEST(MarkdownHtml, PipesInTableCells) {
  // "\|" is a pipe inside a cell; a bare '|' ends the cell.
  EXPECT_EQ(MarkdownToHtml("| largest \\|delta\\| ms | a |\n|---|---|\n| 1 \\| 2 | 3 |"),
            "<table>\n"
            "<thead><tr><th>largest |delta| ms</th><th>a</th></tr></thead><tbody>\n"
            "<tr><td>1 | 2</td><td>3</td></tr>\n"
            "</tbody></table>\n");
}

TEST(MarkdownHtml, CodeSpansAreLiteral) {
  // Inside a code span nothing is markup: no strong, no backslash escape, specials escaped.
  EXPECT_EQ(MarkdownToHtml("x `a<b> **c** \\* d` y"),
            "<p>x <code>a&lt;b&gt; **c** \\* d</code> y</p>\n");
  // A backtick without a partner is a backtick.
  EXPECT_EQ(MarkdownToHtml("one ` alone"), "<p>one ` alone</p>\n");
  EXPECT_EQ(MarkdownToHtml("`a` and `b`"), "<p><code>a</code> and <code>b</code></p>\n");
}

// ---- blocks ----

TEST(MarkdownHtml, StrongIsClosedAtTheEndOfItsBlock) {
  EXPECT_EQ(MarkdownToHtml("Verdict: **pass** (x)."),
            "<p>Verdict: <strong>pass</strong> (x).</p>\n");
  EXPECT_EQ(MarkdownToHtml("**open"), "<p><strong>open</strong></p>\n");
  EXPECT_EQ(MarkdownToHtml("- **open\n- b"),
            "<ul>\n<li><strong>open</strong></li>\n<li>b</li>\n</ul>\n");
}

TEST(MarkdownHtml, Headings) {
  EXPECT_EQ(MarkdownToHtml("# Title\n## Gates\n### Sub"),
            "<h1>Title</h1>\n<h2>Gates</h2>\n<h3>Sub</h3>\n");
  EXPECT_EQ(MarkdownToHtml("###### six"), "<h6>six</h6>\n");
  EXPECT_EQ(MarkdownToHtml("####### seven"), "<p>####### seven</p>\n");
  EXPECT_EQ(MarkdownToHtml("#nospace"), "<p>#nospace</p>\n");
  // A heading ends the paragraph before it.
  EXPECT_EQ(MarkdownToHtml("text\n## Next"), "<p>text</p>\n<h2>Next</h2>\n");
}

TEST(MarkdownHtml, ParagraphsListsAndTablesEndEachOther) {
  EXPECT_EQ(MarkdownToHtml("line one\nline two\n\nnext"),
            "<p>line one line two</p>\n<p>next</p>\n");
  EXPECT_EQ(MarkdownToHtml("- a\n- b\nafter"),
            "<ul>\n<li>a</li>\n<li>b</li>\n</ul>\n<p>after</p>\n");
  EXPECT_EQ(MarkdownToHtml("| h |\n|---|\n| r |\n- item"),
            "<table>\n<thead><tr><th>h</th></tr></thead><tbody>\n<tr><td>r</td></tr>\n"
            "</tbody></table>\n<ul>\n<li>item</li>\n</ul>\n");
  EXPECT_EQ(MarkdownToHtml(""), "");
  EXPECT_EQ(MarkdownToHtml("\n\n"), "");
}

// The shape of a campaign report (harness/campaign/campaign_report.cpp): its charts go before
// "<h2>Gates</h2>", so that heading must come out exactly so.
TEST(MarkdownHtml, CampaignReportShape) {
  const std::string md =
      "# aa-smoke: predeclared A/A diagnostic campaign\n\n"
      "## Summary\n\n"
      "Question: same?\n\n"
      "| arm | mode | overrides |\n|---|---|---|\n"
      "| A1 | state | — |\n"
      "| A2 | state | `inject=[\"delay:stage=2\"]` |\n\n"
      "- `00000_commit` (p=3, T=4): 5 compared\n\n"
      "## Gates\n\n"
      "| comparison | gate | result | detail |\n|---|---|---|---|\n"
      "| A2 vs A1 | state | FAIL | 3 / 5 failed |\n\n"
      "## Conclusion\n\n"
      "Verdict: **fail** (state). No fix is claimed.\n";
  EXPECT_EQ(MarkdownToHtml(md),
            "<h1>aa-smoke: predeclared A/A diagnostic campaign</h1>\n"
            "<h2>Summary</h2>\n"
            "<p>Question: same?</p>\n"
            "<table>\n"
            "<thead><tr><th>arm</th><th>mode</th><th>overrides</th></tr></thead><tbody>\n"
            "<tr><td>A1</td><td>state</td><td>—</td></tr>\n"
            "<tr><td>A2</td><td>state</td><td><code>inject=[&quot;delay:stage=2&quot;]</code></td>"
            "</tr>\n"
            "</tbody></table>\n"
            "<ul>\n<li><code>00000_commit</code> (p=3, T=4): 5 compared</li>\n</ul>\n"
            "<h2>Gates</h2>\n"
            "<table>\n"
            "<thead><tr><th>comparison</th><th>gate</th><th>result</th><th>detail</th></tr>"
            "</thead><tbody>\n"
            "<tr><td>A2 vs A1</td><td>state</td><td>FAIL</td><td>3 / 5 failed</td></tr>\n"
            "</tbody></table>\n"
            "<h2>Conclusion</h2>\n"
            "<p>Verdict: <strong>fail</strong> (state). No fix is claimed.</p>\n");
}

// ---- quotes, links, the shared page ----

TEST(MarkdownHtml, QuotesAreDocumentsOfTheirOwn) {
  EXPECT_EQ(MarkdownToHtml("> **PASS**: all held.\n>\n> - Arms: A1 and A2.\n\n# T"),
            "<blockquote>\n<p><strong>PASS</strong>: all held.</p>\n<ul>\n<li>Arms: A1 and "
            "A2.</li>\n</ul>\n</blockquote>\n<h1>T</h1>\n");
  // A line after the quote starts the next block; ">x" (no space) is text.
  EXPECT_EQ(MarkdownToHtml("> a\nb"), "<blockquote>\n<p>a</p>\n</blockquote>\n<p>b</p>\n");
  EXPECT_EQ(MarkdownToHtml(">x"), "<p>&gt;x</p>\n");
  EXPECT_EQ(MarkdownToHtml("> <b>"), "<blockquote>\n<p>&lt;b&gt;</p>\n</blockquote>\n");
}

TEST(MarkdownHtml, OnlyRelativeSiblingLinks) {
  EXPECT_EQ(MarkdownToHtml("[HTML](compare/A2.html)"),
            "<p><a href=\"compare/A2.html\">HTML</a></p>\n");
  // Anything that could leave the report's folder, run script or carry markup stays text.
  for (const char* bad : {"[x](/etc/passwd)", "[x](../up.html)", "[x](javascript:alert(1))",
                          "[x](https://example.com)", "[x](a b.html)", "[x](a\"b)", "[](a.html)"})
    EXPECT_EQ(MarkdownToHtml(bad).find("<a "), std::string::npos) << bad;
  EXPECT_EQ(MarkdownToHtml("\\[x\\](a.html)"), "<p>[x](a.html)</p>\n");
  EXPECT_EQ(MarkdownToHtml("[**b**](a.html)"),
            "<p><a href=\"a.html\"><strong>b</strong></a></p>\n");
  EXPECT_EQ(MarkdownToHtml("[open"), "<p>[open</p>\n");
}

TEST(MarkdownHtml, OneStylesheetForEveryPage) {
  const std::string page = HtmlDocument("t <1>", "<p>x</p>\n");
  EXPECT_TRUE(page.starts_with("<!DOCTYPE html>\n"));
  EXPECT_NE(page.find("<title>t &lt;1&gt;</title>"), std::string::npos);
  EXPECT_NE(page.find(ReportStylesheet()), std::string::npos);
  EXPECT_NE(page.find("<body>\n<p>x</p>\n</body>"), std::string::npos);
  EXPECT_NE(std::string(ReportStylesheet()).find(".verdict-fail"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
