// Tests for engine/atomic_file.{h,cpp}: WriteFileAtomic, AtomicFileWriter and ReadFile.
#include "lockstep/engine/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// A fresh scratch folder per test, removed afterwards.
class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::NewDir("lockstep_atomic");
  }  // removed with ScratchDir() at exit
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(AtomicFileTest, WriteThenRead) {
  const std::string path = Path("a.txt");
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view("hello\nworld")).ok());
  const Result<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "hello\nworld");
}

TEST_F(AtomicFileTest, WriteBytesIncludingZeros) {
  const std::string path = Path("b.bin");
  std::vector<std::byte> bytes(70000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7u);
  ASSERT_TRUE(WriteFileAtomic(path, std::span<const std::byte>(bytes)).ok());
  const Result<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    ASSERT_EQ(static_cast<std::byte>((*got)[i]), bytes[i]) << i;
  }
}

TEST_F(AtomicFileTest, EmptyFile) {
  const std::string path = Path("empty");
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view()).ok());
  const Result<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "");
}

TEST_F(AtomicFileTest, OverwriteReplacesWholeContent) {
  const std::string path = Path("c.txt");
  ASSERT_TRUE(WriteFileAtomic(path, std::string(10000, 'x')).ok());
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view("short")).ok());
  const Result<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "short");  // no tail of the old, longer content
}

TEST_F(AtomicFileTest, NoTemporaryLeftBehind) {
  ASSERT_TRUE(WriteFileAtomic(Path("d.txt"), std::string_view("1")).ok());
  ASSERT_TRUE(WriteFileAtomic(Path("d.txt"), std::string_view("2")).ok());
  ASSERT_TRUE(WriteFileAtomic(Path("e.txt"), std::string_view("3")).ok());
  EXPECT_EQ(Listing(), (std::vector<std::string>{"d.txt", "e.txt"}));
}

// A missing folder is bad input (exit 2), not a runtime failure (issue 20, part 6).
TEST_F(AtomicFileTest, MissingFolderIsInvalidArgument) {
  const std::string path = Path("no/such/folder/f.txt");
  const Status s = WriteFileAtomic(path, std::string_view("x"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_NE(s.message().find("the folder '" + Path("no/such/folder") + "' does not exist"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("No such file or directory"), std::string::npos) << s.message();
  EXPECT_TRUE(Listing().empty());
}

TEST_F(AtomicFileTest, ReadMissingFileIsNotFound) {
  const Result<std::string> got = ReadFile(Path("missing.txt"));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Status::Code::kNotFound) << got.status().ToString();
  EXPECT_NE(got.status().message().find("missing.txt"), std::string::npos);
}

TEST_F(AtomicFileTest, ReadFileSizeGuard) {
  const std::string path = Path("big.txt");
  ASSERT_TRUE(WriteFileAtomic(path, std::string(100, 'y')).ok());
  const Result<std::string> small = ReadFile(path, 99);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), Status::Code::kInvalidArgument) << small.status().ToString();
  const Result<std::string> exact = ReadFile(path, 100);
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  EXPECT_EQ(exact->size(), 100u);
}

TEST_F(AtomicFileTest, ReadFolderIsIOError) {
  const Result<std::string> got = ReadFile(dir_.string());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Status::Code::kIOError) << got.status().ToString();
}

TEST_F(AtomicFileTest, ReadFileWithUnknownSize) {
  // /proc files stat as 0 bytes; ReadFile must read to EOF anyway.
  const Result<std::string> got = ReadFile("/proc/self/status");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_NE(got->find("Name:"), std::string::npos);
}

// ---- AtomicFileWriter ----

TEST_F(AtomicFileTest, WriterStreamsAndPublishesOnCommit) {
  const std::string path = Path("g.bin");
  Result<AtomicFileWriter> w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->temp_path(), path + ".tmp." + std::to_string(::getpid()));
  ASSERT_TRUE(w->Append(std::string_view("abc")).ok());
  ASSERT_TRUE(w->Append(std::string_view("")).ok());
  ASSERT_TRUE(w->Append(std::string(5000, 'z')).ok());
  EXPECT_EQ(w->bytes_written(), 5003u);
  EXPECT_FALSE(fs::exists(path)) << "nothing is visible before Commit()";
  EXPECT_TRUE(fs::exists(w->temp_path()));
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_FALSE(fs::exists(w->temp_path()));
  const Result<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "abc" + std::string(5000, 'z'));

  // A committed writer refuses more work.
  EXPECT_EQ(w->Append(std::string_view("x")).code(), Status::Code::kIOError);
  EXPECT_EQ(w->Commit().code(), Status::Code::kIOError);
  EXPECT_EQ(Listing(), (std::vector<std::string>{"g.bin"}));
}

TEST_F(AtomicFileTest, WriterWithoutCommitKeepsOldContentAndRemovesTemp) {
  const std::string path = Path("h.txt");
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view("old")).ok());
  {
    Result<AtomicFileWriter> w = AtomicFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append(std::string_view("new content")).ok());
    // destroyed here, e.g. by an early error return
  }
  EXPECT_EQ(Listing(), (std::vector<std::string>{"h.txt"}));
  const Result<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "old");
}

TEST_F(AtomicFileTest, WriterMoveTransfersOwnership) {
  const std::string path = Path("i.txt");
  Result<AtomicFileWriter> w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok());
  AtomicFileWriter moved = std::move(w).value();
  ASSERT_TRUE(moved.Append(std::string_view("moved")).ok());
  ASSERT_TRUE(moved.Commit().ok());
  const Result<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "moved");
  EXPECT_EQ(Listing(), (std::vector<std::string>{"i.txt"}));
}

TEST_F(AtomicFileTest, WriterCreateInMissingFolderIsInvalidArgument) {
  const Result<AtomicFileWriter> w = AtomicFileWriter::Create(Path("nope/j.txt"));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(w.status().message().find("nope/j.txt"), std::string::npos) << w.status().message();
}

TEST_F(AtomicFileTest, BareFileNameUsesCurrentFolder) {
  // The folder fsync after the rename must work for a path without a folder part.
  const fs::path old_cwd = fs::current_path();
  fs::current_path(dir_);
  const Status s = WriteFileAtomic("bare.txt", std::string_view("x"));
  fs::current_path(old_cwd);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Listing(), (std::vector<std::string>{"bare.txt"}));
}

}  // namespace
}  // namespace lockstep
