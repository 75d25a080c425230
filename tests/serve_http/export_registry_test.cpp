// ServedExport (harness/serve/export_registry.h): the owner of a served export's registration. A
// name is `writing` while its owner lives, downloadable once finished, and forgotten when its owner
// goes before it finished, whichever path the request took.
#include "serve/export_registry.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "test_util.h"

namespace lockstep {
namespace {

using State = ExportRegistry::State;

std::string WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(ServedExport, AnUnfinishedExportIsForgottenWithItsOwner) {
  ExportRegistry reg;
  const std::string dir = test::NewDir("served_export");
  {
    ServedExport e(reg, "a.h5", dir + "/a.h5");
    EXPECT_TRUE(static_cast<bool>(e));
    EXPECT_EQ(reg.Lookup("a.h5", nullptr), State::kWriting);
  }
  EXPECT_EQ(reg.Lookup("a.h5", nullptr), State::kUnknown) << "no path leaves a writing name behind";
}

TEST(ServedExport, AFinishedExportOutlivesItsOwner) {
  ExportRegistry reg;
  const std::string dir = test::NewDir("served_export");
  {
    ServedExport e(reg, "b.h5", dir + "/b.h5");
    WriteFile(dir + "/b.h5", "bytes");
    auto entry = e.Finish();
    ASSERT_TRUE(entry.ok()) << entry.status().ToString();
    EXPECT_EQ(entry->bytes, 5u);
    EXPECT_EQ(entry->sha256.size(), 64u);
  }
  ExportEntry got;
  ASSERT_EQ(reg.Lookup("b.h5", &got), State::kFinished);
  EXPECT_EQ(got.path, dir + "/b.h5");
}

TEST(ServedExport, ForgetDropsAFinishedNameAndMovesHandOver) {
  ExportRegistry reg;
  const std::string dir = test::NewDir("served_export");
  ServedExport e(reg, "c.h5", WriteFile(dir + "/c.h5", "x"));
  ASSERT_TRUE(e.Finish().ok());
  ServedExport moved = std::move(e);
  EXPECT_FALSE(static_cast<bool>(e));  // NOLINT(bugprone-use-after-move): moved-from is empty
  e.Forget();                          // an empty owner does nothing
  EXPECT_EQ(reg.Lookup("c.h5", nullptr), State::kFinished);
  moved.ForgetIfWriting();
  EXPECT_EQ(reg.Lookup("c.h5", nullptr), State::kFinished) << "finished: kept";
  moved.Forget();
  EXPECT_EQ(reg.Lookup("c.h5", nullptr), State::kUnknown);
  ServedExport none;
  EXPECT_FALSE(none.Finish().ok());
}

// The digest served is the file's own (issue 43): a download checks that the name still holds
// the very file that was hashed. A file rewritten in place with other bytes of the same size, or
// replaced by another file (rename), or by a symlink, is no longer the hashed one.
TEST(ExportRegistry, OnlyTheFileThatWasHashedIsTheFinishedExport) {
  ExportRegistry reg;
  const std::string dir = test::NewDir("export_same_file");
  const std::string path = WriteFile(dir + "/a.h5", "0123456789");
  reg.Writing("a.h5", path);
  auto e = reg.Finish("a.h5");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto now = [&] {
    struct stat st {};
    EXPECT_EQ(::lstat(path.c_str(), &st), 0);
    return st;
  };
  EXPECT_TRUE(SameFileAsHashed(*e, now()));
  // Rewritten in place, same size, other bytes (mtime moves on).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  WriteFile(path, "9876543210");
  EXPECT_FALSE(SameFileAsHashed(*e, now()));
  // Replaced by another file of the same bytes: another inode.
  reg.Writing("b.h5", WriteFile(dir + "/b.h5", "0123456789"));
  auto b = reg.Finish("b.h5");
  ASSERT_TRUE(b.ok());
  WriteFile(dir + "/c.h5", "0123456789");
  std::filesystem::rename(dir + "/c.h5", dir + "/b.h5");
  struct stat st {};
  ASSERT_EQ(::lstat((dir + "/b.h5").c_str(), &st), 0);
  EXPECT_FALSE(SameFileAsHashed(*b, st));
  // A symlink is never finished.
  std::filesystem::create_symlink(dir + "/b.h5", dir + "/l.h5");
  reg.Writing("l.h5", dir + "/l.h5");
  EXPECT_FALSE(reg.Finish("l.h5").ok());
  EXPECT_EQ(reg.Lookup("l.h5", nullptr), State::kUnknown);
}

}  // namespace
}  // namespace lockstep
