// ServedExport (harness/serve/export_registry.h): the owner of a served export's registration. A
// name is `writing` while its owner lives, downloadable once finished, and forgotten when its owner
// goes before it finished, whichever path the request took.
#include "serve/export_registry.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
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

}  // namespace
}  // namespace lockstep
