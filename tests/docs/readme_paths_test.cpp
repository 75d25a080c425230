// README.md is the map of the repository (issue 19): every repository path it names must exist,
// it stays at most 250 lines, and its "Where to change" table answers its six questions.
//
// What counts as a path: an inline code span (`...`) outside fenced blocks, or the target of a
// relative Markdown link [text](target), that
//   - has no space, is no URL, does not start with `--`, and holds no placeholder or glob
//     character (* ? [ ] < > | $ = , ( ) quotes, "..."); one {a,b} group is expanded;
//   - after a trailing `:line` and `/` are stripped, contains a '/' and ends in a known source or
//     document extension, or was written with a trailing '/', or starts with a top-level folder
//     of the repository; or, without a '/', ends in a known extension (`CMakeLists.txt`).
// Not checked, because they are not in the repository: absolute paths (HDF5 paths such as
// `/index/items`, `/usr/local/cuda`), paths that leave it (`../shared/DESIGN.md`) and generated
// outputs (`out/`, `build/`, `build-*/`, `DIR/`). Fenced code blocks hold commands and diagrams,
// not references, and are skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {
namespace {

namespace fs = std::filesystem;

constexpr std::array<std::string_view, 11> kExtensions{
    ".cpp", ".h", ".hpp", ".cu", ".cuh", ".md", ".toml", ".sh", ".txt", ".cmake", ".py"};
constexpr std::array<std::string_view, 10> kTopFolders{
    "engine", "harness",   "compare", "instrument", "h5",
    "tests",  "campaigns", "scripts", ".ci",        "docs"};
constexpr std::array<std::string_view, 3> kGeneratedPrefixes{"out/", "build/", "DIR/"};

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

bool HasKnownExtension(std::string_view s) {
  return std::any_of(kExtensions.begin(), kExtensions.end(),
                     [&](std::string_view e) { return EndsWith(s, e); });
}

// Expands one "{a,b}" group ("json_util.{h,cpp}" -> "json_util.h", "json_util.cpp"); a token
// with no group comes back alone, one with nested or several groups comes back empty.
std::vector<std::string> ExpandBraces(const std::string& t) {
  const auto open = t.find('{');
  if (open == std::string::npos)
    return t.find('}') == std::string::npos ? std::vector<std::string>{t}
                                            : std::vector<std::string>{};
  const auto close = t.find('}', open);
  if (close == std::string::npos) return {};
  const std::string head = t.substr(0, open), tail = t.substr(close + 1);
  const std::string body = t.substr(open + 1, close - open - 1);
  if (body.find('{') != std::string::npos || tail.find_first_of("{}") != std::string::npos)
    return {};
  std::vector<std::string> out;
  std::stringstream parts(body);
  for (std::string alt; std::getline(parts, alt, ',');) out.push_back(head + alt + tail);
  return out;
}

// The repository paths a code span or link target names (empty when it names none).
std::vector<std::string> RepoPaths(std::string token) {
  if (token.empty() || token.find_first_of(" \t") != std::string::npos) return {};
  if (StartsWith(token, "--") || token.find("://") != std::string::npos) return {};
  if (token.find("...") != std::string::npos) return {};
  if (token.front() == '/' || token.front() == '~' || StartsWith(token, "../")) return {};
  if (StartsWith(token, "./")) token = token.substr(2);
  for (std::string_view g : kGeneratedPrefixes)
    if (StartsWith(token, g)) return {};
  if (StartsWith(token, "build-")) return {};
  std::vector<std::string> out;
  for (std::string t : ExpandBraces(token)) {
    if (t.find_first_of("*?[]<>|$=,()'\"{}") != std::string::npos) continue;
    // A trailing ":line" or ":line:col".
    for (int i = 0; i < 2; ++i) {
      const auto colon = t.rfind(':');
      if (colon == std::string::npos || colon + 1 == t.size()) break;
      if (!std::all_of(t.begin() + static_cast<std::ptrdiff_t>(colon) + 1, t.end(),
                       [](char c) { return c >= '0' && c <= '9'; }))
        break;
      t.resize(colon);
    }
    if (t.find(':') != std::string::npos) continue;
    const bool folder = EndsWith(t, "/");
    while (EndsWith(t, "/")) t.pop_back();
    if (t.empty()) continue;
    const auto slash = t.find('/');
    bool is_path = false;
    if (slash == std::string::npos) {
      is_path = t.front() != '.' && HasKnownExtension(t);  // `.cpp` alone is an extension
    } else {
      const std::string_view first(t.data(), slash);
      is_path = folder || HasKnownExtension(t) ||
                std::find(kTopFolders.begin(), kTopFolders.end(), first) != kTopFolders.end();
    }
    if (is_path) out.push_back(t);
  }
  return out;
}

struct Scan {
  std::vector<std::string> lines;
  std::vector<std::string> spans;         // inline code spans outside fenced blocks
  std::vector<std::string> link_targets;  // relative Markdown link targets, '#anchor' removed
};

// Code spans of one line (a run of N backticks up to the next run of N), and the line with
// those spans blanked out, so that links are looked for in prose only.
std::string TakeSpans(const std::string& line, std::vector<std::string>& spans) {
  std::string prose;
  std::size_t i = 0;
  while (i < line.size()) {
    if (line[i] != '`') {
      prose += line[i++];
      continue;
    }
    std::size_t n = 0;
    while (i + n < line.size() && line[i + n] == '`') ++n;
    const std::string fence(n, '`');
    const auto end = line.find(fence, i + n);
    if (end == std::string::npos) {  // an unmatched run is literal text
      prose += fence;
      i += n;
      continue;
    }
    std::string span = line.substr(i + n, end - i - n);
    if (n > 1 && span.size() >= 2 && span.front() == ' ' && span.back() == ' ')
      span = span.substr(1, span.size() - 2);
    spans.push_back(span);
    prose += ' ';
    i = end + n;
  }
  return prose;
}

void TakeLinks(const std::string& prose, std::vector<std::string>& targets) {
  for (std::size_t at = prose.find("]("); at != std::string::npos; at = prose.find("](", at + 2)) {
    const auto end = prose.find(')', at + 2);
    if (end == std::string::npos) break;
    std::string target = prose.substr(at + 2, end - at - 2);
    if (const auto sp = target.find(' '); sp != std::string::npos) target.resize(sp);  // a title
    if (const auto hash = target.find('#'); hash != std::string::npos) target.resize(hash);
    if (target.empty() || target.find("://") != std::string::npos || StartsWith(target, "mailto:"))
      continue;
    targets.push_back(target);
  }
}

Scan ScanMarkdown(std::string_view text) {
  Scan s;
  std::stringstream in{std::string(text)};
  bool fenced = false;
  for (std::string line; std::getline(in, line);) {
    s.lines.push_back(line);
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos && (StartsWith(std::string_view(line).substr(first), "```") ||
                                       StartsWith(std::string_view(line).substr(first), "~~~"))) {
      fenced = !fenced;
      continue;
    }
    if (fenced) continue;
    TakeLinks(TakeSpans(line, s.spans), s.link_targets);
  }
  return s;
}

std::string ReadReadme() {
  const fs::path path = fs::path(LOCKSTEP_SOURCE_DIR) / "README.md";
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Cells of a Markdown table row "| a | b |" (trimmed).
std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cur;
  for (std::size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '|' && row[i - 1] != '\\') {
      const auto b = cur.find_first_not_of(' '), e = cur.find_last_not_of(' ');
      cells.push_back(b == std::string::npos ? "" : cur.substr(b, e - b + 1));
      cur.clear();
    } else {
      cur += row[i];
    }
  }
  return cells;
}

// ---- the extractor itself, so the README checks below cannot pass by extracting nothing ----

TEST(ReadmePathExtraction, KeepsPathsAndDropsCommandsFlagsAndPlaceholders) {
  using V = std::vector<std::string>;
  EXPECT_EQ(RepoPaths("engine/cuda/ops.h"), V{"engine/cuda/ops.h"});
  EXPECT_EQ(RepoPaths("engine/cpu/"), V{"engine/cpu"});
  EXPECT_EQ(RepoPaths("harness/cli"), V{"harness/cli"});
  EXPECT_EQ(RepoPaths("compare/report.cpp:123"), V{"compare/report.cpp"});
  EXPECT_EQ(RepoPaths("CMakeLists.txt"), V{"CMakeLists.txt"});
  EXPECT_EQ(RepoPaths(".ci/run"), V{".ci/run"});
  EXPECT_EQ(RepoPaths("engine/util/json_util.{h,cpp}"),
            (V{"engine/util/json_util.h", "engine/util/json_util.cpp"}));
  EXPECT_EQ(RepoPaths("enigne/typo.cpp"), V{"enigne/typo.cpp"});  // checked, so it fails
  EXPECT_TRUE(RepoPaths(".cpp").empty());
  for (const char* not_a_path :
       {"lockstep diff", "--export-windows", "/index/items", "/usr/local/cuda",
        "../shared/DESIGN.md", "out/demo/aa-demo/report.md", "build/harness/lockstep",
        "DIR/ledger.jsonl", "s*n/stages", "f32/bf16/int8", "none/mtp/suffix/merged",
        "stage{S}/layer{L}/k", "arms/<arm>/config.json", "https://example.org/a.md", "config.json",
        "lockstep.export", "Faults/EmuGraphFallback.*"})
    EXPECT_TRUE(RepoPaths(not_a_path).empty()) << not_a_path;
}

TEST(ReadmePathExtraction, SkipsFencedBlocksAndFindsRelativeLinks) {
  const Scan s = ScanMarkdown(
      "see `engine/a.h` and [b](docs/engine.md#map), [c](https://x.org/y)\n"
      "```sh\n`engine/in_fence.h` [d](in/fence.md)\n```\n"
      "``double `tick` span`` then `x/`\n");
  EXPECT_EQ(s.spans, (std::vector<std::string>{"engine/a.h", "double `tick` span", "x/"}));
  EXPECT_EQ(s.link_targets, std::vector<std::string>{"docs/engine.md"});
}

// ---- README.md ----

TEST(Readme, IsAtMost250Lines) {
  const Scan s = ScanMarkdown(ReadReadme());
  EXPECT_LE(s.lines.size(), 250u)
      << "README.md is the map; long sections belong in the folders' own docs";
}

TEST(Readme, EveryNamedPathExists) {
  const Scan s = ScanMarkdown(ReadReadme());
  const fs::path root(LOCKSTEP_SOURCE_DIR);
  std::set<std::string> paths;
  for (const std::string& span : s.spans)
    for (std::string& p : RepoPaths(span)) paths.insert(std::move(p));
  std::vector<std::string> missing;
  for (const std::string& p : paths)
    if (!fs::exists(root / p)) missing.push_back(p);
  EXPECT_GE(paths.size(), 20u) << "the path extraction found too few paths to mean anything";
  std::string list;
  for (const std::string& m : missing) list += "\n  " + m;
  EXPECT_TRUE(missing.empty()) << missing.size() << " of " << paths.size()
                               << " paths named in README.md do not exist:" << list;
}

TEST(Readme, EveryRelativeLinkExists) {
  const Scan s = ScanMarkdown(ReadReadme());
  const fs::path root(LOCKSTEP_SOURCE_DIR);
  std::vector<std::string> missing;
  int checked = 0;
  for (const std::string& target : s.link_targets) {
    if (target.front() == '/' || StartsWith(target, "../")) continue;  // outside the repository
    ++checked;
    if (!fs::exists(root / target)) missing.push_back(target);
  }
  EXPECT_GE(checked, 4) << "README.md should link the folders' own docs";
  std::string list;
  for (const std::string& m : missing) list += "\n  " + m;
  EXPECT_TRUE(missing.empty()) << "links in README.md to files that do not exist:" << list;
}

TEST(Readme, WhereToChangeAnswersTheSixQuestions) {
  const Scan s = ScanMarkdown(ReadReadme());
  const auto heading = std::find(s.lines.begin(), s.lines.end(), "## Where to change");
  ASSERT_NE(heading, s.lines.end()) << "README.md has no '## Where to change' section";
  auto it =
      std::find_if(heading, s.lines.end(), [](const std::string& l) { return StartsWith(l, "|"); });
  ASSERT_NE(it, s.lines.end()) << "the 'Where to change' section has no table";
  ++it;  // the header row
  ASSERT_NE(it, s.lines.end());
  ASSERT_TRUE(StartsWith(*it, "|---") || StartsWith(*it, "| ---")) << "expected the separator row";
  std::vector<std::string> rows;
  for (++it; it != s.lines.end() && StartsWith(*it, "|"); ++it) rows.push_back(*it);
  const std::vector<std::string> questions{"an engine option", "a checkpoint item",
                                           "a kernel",         "a draft policy",
                                           "a gate",           "a report field"};
  ASSERT_EQ(rows.size(), questions.size()) << "one row per question";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::vector<std::string> cells = Cells(rows[i]);
    ASSERT_GE(cells.size(), 2u) << rows[i];
    EXPECT_EQ(cells[0], questions[i]);
    std::vector<std::string> spans;
    for (std::size_t c = 1; c < cells.size(); ++c) TakeSpans(cells[c], spans);
    int paths = 0;
    for (const std::string& span : spans) paths += static_cast<int>(RepoPaths(span).size());
    EXPECT_GE(paths, 2) << "the answer to '" << questions[i] << "' should name the files to edit";
  }
}

}  // namespace
}  // namespace lockstep
