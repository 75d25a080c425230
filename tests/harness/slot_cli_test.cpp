// `lockstep generate --save-slot / --restore-slot` on the real binary: a saved conversation
// continues, and a damaged, truncated, foreign or missing slot file is refused with exit 2 and a
// message that names the part (the section, the version, the model), before any work.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/engine/atomic_file.h"
#include "serve/slot_file.h"
#include "test_util.h"

namespace lockstep {
namespace {

std::string Base(const std::string& preset = "tiny") {
  return "generate --model " + test::ModelDir(preset) +
         " --threads 2 --prefill 16 --spec 3 --max-new 12 --ignore-eos --no-progress";
}

class SlotCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::NewDir("slot-cli");
    slot_ = dir_ + "/a.slot";
    const auto r = test::RunLockstep(Base() + " --prompt 'the first turn of it' --save-slot " +
                                     slot_ + " --json -");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    ASSERT_TRUE(j.contains("slot_file")) << r.out;
    EXPECT_EQ(j["slot_file"]["saved"], slot_);
    EXPECT_EQ(j["slot_file"]["saved_tokens"], 20 + 12);  // prompt bytes + output
    auto bytes = ReadFile(slot_);
    ASSERT_TRUE(bytes.ok());
    file_ = *bytes;
  }
  // `generate --restore-slot` of `bytes` written to a file.
  test::CmdResult Restore(const std::string& bytes, const std::string& extra = "") {
    const std::string p = dir_ + "/b.slot";
    EXPECT_TRUE(WriteFileAtomic(p, std::string_view(bytes)).ok());
    return test::RunLockstep(Base() + extra + " --restore-slot " + p +
                             " --prompt ' more' --json -");
  }
  std::string dir_, slot_, file_;
};

TEST_F(SlotCli, RestoredConversationContinuesTheSameWayTwice) {
  const auto a = Restore(file_);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto b = Restore(file_);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["output_ids"], jb["output_ids"]);
  EXPECT_EQ(ja["output_ids"].size(), 12u);
  EXPECT_EQ(ja["slot_file"]["restored_tokens"], 32);
  EXPECT_TRUE(ja["slot_file"].contains("restore_ms"));
}

TEST_F(SlotCli, DamagedFilesExitTwoNamingThePart) {
  auto table = slot_file::ReadSectionTable(file_);
  ASSERT_TRUE(table.ok());
  const slot_file::SectionEntry& k = (*table)[1];  // the first attention or GDN section
  std::string flipped = file_;
  flipped[k.offset + 3] = static_cast<char>(flipped[k.offset + 3] ^ 0x04);
  auto r = Restore(flipped);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("section '" + k.name + "'"), std::string::npos) << r.err;
  r = Restore(file_.substr(0, file_.size() / 2));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  std::string v2 = file_;
  v2[16] = 2;
  r = Restore(v2);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("slot file version"), std::string::npos) << r.err;
  r = Restore(file_, " --kv int8");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--kv"), std::string::npos) << r.err;
}

TEST_F(SlotCli, AnotherModelAMissingFileAndAMissingFolderExitTwo) {
  auto r = test::RunLockstep(Base("tiny-induction") + " --restore-slot " + slot_ + " --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("slot file model"), std::string::npos) << r.err;
  r = test::RunLockstep(Base() + " --restore-slot " + dir_ + "/none.slot --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = test::RunLockstep(Base() + " --prompt x --save-slot " + dir_ + "/no/such/dir/a.slot");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--save-slot"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lockstep
