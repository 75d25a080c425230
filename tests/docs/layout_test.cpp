// The repository's layout rules (issue 19), checked on the source tree:
//   - engine/'s top level holds only CMakeLists.txt, include/ and concept folders;
//   - a product file (engine/ harness/ compare/ instrument/ h5/) over 800 lines says why in a
//     "// Long file: <reason>" line among its first 10 lines (STYLE.md B.8: split a file when it
//     grows a second concept; about 800 lines is the warning sign).
// Function length (no product function over ~120 lines except CUDA kernels) is checked by
// scripts/long_functions.py, the ctest `Layout.NoLongFunctions`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lockstep {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = LOCKSTEP_SOURCE_DIR;

TEST(Layout, EngineTopLevelIsOnlyConceptFolders) {
  std::vector<std::string> stray;
  int folders = 0;
  for (const auto& e : fs::directory_iterator(kRoot / "engine")) {
    const std::string name = e.path().filename().string();
    if (e.is_directory()) {
      ++folders;
      continue;
    }
    if (name != "CMakeLists.txt") stray.push_back(name);
  }
  EXPECT_TRUE(stray.empty()) << "files at engine/'s top level (move them into a concept folder): "
                             << ::testing::PrintToString(stray);
  EXPECT_TRUE(fs::is_directory(kRoot / "engine/include/lockstep/engine"));
  EXPECT_GE(folders, 7) << "engine/ should hold include/ and its concept folders";
}

// Lines of a file and whether one of its first 10 lines gives the long-file reason.
struct FileLines {
  int n = 0;
  bool has_reason = false;
};
FileLines Count(const fs::path& p) {
  std::ifstream f(p);
  FileLines r;
  std::string line;
  while (std::getline(f, line)) {
    if (r.n < 10 && line.rfind("// Long file: ", 0) == 0 && line.size() > 20) r.has_reason = true;
    ++r.n;
  }
  return r;
}

TEST(Layout, ProductFilesOver800LinesSayWhy) {
  std::vector<std::string> bad;
  int files = 0;
  for (const char* root : {"engine", "harness", "compare", "instrument", "h5"}) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / root)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh"))
        continue;
      ++files;
      const FileLines c = Count(e.path());
      if (c.n > 800 && !c.has_reason)
        bad.push_back(fs::relative(e.path(), kRoot).string() + " (" + std::to_string(c.n) + ")");
    }
  }
  EXPECT_GT(files, 100) << "the walk found too few product files to mean anything";
  EXPECT_TRUE(bad.empty()) << "product files over 800 lines without a '// Long file: <reason>' "
                              "line at their top (split them along their concepts): "
                           << ::testing::PrintToString(bad);
}

// No arrow back up inside harness/ (issue 36): harness/cli/ is the `lockstep` executable alone, so
// no other room includes a file of it, by its "cli/" path or by the name of one of its headers.
TEST(Layout, NothingIncludesUpIntoHarnessCli) {
  std::vector<std::string> cli_headers;
  for (const auto& e : fs::directory_iterator(kRoot / "harness/cli"))
    if (e.path().extension() == ".h") cli_headers.push_back(e.path().filename().string());
  ASSERT_FALSE(cli_headers.empty());
  std::vector<std::string> bad;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "harness")) {
    const std::string rel = fs::relative(e.path(), kRoot).string();
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || rel.rfind("harness/cli/", 0) == 0 || (ext != ".cpp" && ext != ".h"))
      continue;
    ++files;
    std::ifstream f(e.path());
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      if (line.rfind("#include \"", 0) != 0) continue;
      const std::string inc = line.substr(10, line.find('"', 10) - 10);
      bool up = inc.rfind("cli/", 0) == 0;
      for (const std::string& h : cli_headers) up = up || inc == h;
      if (up) bad.push_back(rel + ":" + std::to_string(n) + " " + inc);
    }
  }
  EXPECT_GT(files, 50) << "the walk found too few harness files to mean anything";
  EXPECT_TRUE(bad.empty()) << "includes up into harness/cli/ (move what they need to "
                              "harness/commands/): "
                           << ::testing::PrintToString(bad);
}

}  // namespace
}  // namespace lockstep
