// Golden exports: the bits of what the engine computes, pinned across commits.
//
// For fixed requests on `tiny` and `small` (4 stages, spec 4 with MTP and suffix drafts, int8 and
// bf16 K/V, chunked prefill, every window and checkpoint exported) this runs the real `lockstep
// generate`, reads the export back and checks, against tests/golden/exports.json:
//   - the SHA-256 of every exported state item (the raw bytes of its rows, int8 scales separately),
//     with its dtype and shape, at every checkpoint;
//   - the output tokens and the stop reason;
//   - each window's path fields (p, T, T_mtp, merged, from_sfx, chain_n, accepted);
//   - the synthetic model's digest (a changed model maker changes every item: said first).
// Timing fields, run ids, the config JSON and the executable digest are not pinned.
//
// The file was recorded from main at dcb0067, before the issue-19 moves. A deliberate numeric
// change re-records it and says so, with the evidence that the new numbers are right:
//   LOCKSTEP_GOLDEN_RECORD=1 build/tests/golden_tests
// (writes tests/golden/exports.json in the source tree).
#include "lockstep/harness/golden.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "test_util.h"

namespace lockstep {
namespace {

constexpr const char* kSchema = "lockstep.golden-exports";
constexpr int kSchemaVersion = 1;
const std::string kGoldenPath = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/golden/exports.json";

// A repeated prompt, so that the suffix index drafts, on the induction variant of each preset, so
// that drafts are accepted and windows grow past T = 1; --prefill 16 cuts it into chunks.
constexpr const char* kPrompt =
    "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the "
    "quick";

struct Request {
  std::string name;   // key in the golden file
  std::string model;  // test::ModelDir preset
  std::string flags;  // engine and export flags after --model / --prompt
};

std::vector<Request> Requests() {
  const std::string common =
      "--stages 4 --spec 4 --mtp on --prefill 16 --ignore-eos --export-windows all "
      "--export-points pre_verify,post_verify,commit --threads 1";
  return {
      {"tiny-int8", "tiny-induction", common + " --kv int8 --max-new 24"},
      {"tiny-bf16", "tiny-induction", common + " --kv bf16 --max-new 24"},
      {"small-int8", "small-induction", common + " --kv int8 --max-new 16"},
      {"small-bf16", "small-induction", common + " --kv bf16 --max-new 16"},
  };
}

// A window's path fields (timing is not deterministic and not pinned).
nlohmann::ordered_json PathJson(const WindowRecord& w) {
  return {{"p", w.p},
          {"T", w.T},
          {"T_mtp", w.T_mtp},
          {"merged", w.merged},
          {"from_sfx", w.from_sfx},
          {"chain_n", w.chain_n},
          {"accepted", w.accepted}};
}

// What the golden file holds for one request, built from its export.
nlohmann::ordered_json Digest(const ExportReader& reader) {
  const ExportMeta& m = reader.meta();
  nlohmann::ordered_json j;
  j["model_sha256"] = m.model_sha256;
  j["request_tokens"] = m.request_tokens.size();
  j["output_tokens"] = m.output_tokens;
  j["stop_reason"] = m.stop_reason;
  nlohmann::ordered_json windows = nlohmann::ordered_json::array();
  for (const WindowRecord& w : m.windows) {
    windows.push_back(PathJson(w));
  }
  j["windows"] = windows;
  // The digests `lockstep golden record` stores too (harness/golden/manifest.cpp).
  auto digests = ExportItemDigests(reader);
  if (!digests.ok()) throw std::runtime_error(digests.status().ToString());
  nlohmann::ordered_json items = nlohmann::ordered_json::object();
  for (const ItemDigest& d : *digests) items[d.key] = DigestText(d);
  j["n_checkpoints"] = m.checkpoints.size();
  j["items"] = items;
  return j;
}

nlohmann::ordered_json RunRequest(const Request& r) {
  const std::string out = test::NewDir("golden-" + r.name) + "/export.h5";
  auto res = test::RunLockstep("generate --model " + test::ModelDir(r.model) + " --prompt '" +
                               kPrompt + "' " + r.flags + " --export " + out);
  if (res.exit_code != 0) throw std::runtime_error("generate failed (" + r.name + "): " + res.err);
  auto reader = ExportReader::Open(out);
  if (!reader.ok()) throw std::runtime_error(reader.status().ToString());
  nlohmann::ordered_json j;
  j["model"] = r.model;
  j["flags"] = r.flags;
  nlohmann::ordered_json digest = Digest(**reader);
  for (auto& [k, v] : digest.items()) j[k] = v;
  std::filesystem::remove(out);
  return j;
}

// The first difference between two digests of one request, as a sentence.
std::string FirstDifference(const nlohmann::ordered_json& want, const nlohmann::ordered_json& got) {
  if (want["model_sha256"] != got["model_sha256"])
    return "the synthetic model changed (model_sha256 " + got["model_sha256"].dump() + ", golden " +
           want["model_sha256"].dump() + "): every item follows from it";
  for (const char* k : {"request_tokens", "output_tokens", "stop_reason", "n_checkpoints"})
    if (want[k] != got[k])
      return std::string(k) + ": got " + got[k].dump() + ", golden " + want[k].dump();
  const auto& ww = want["windows"];
  const auto& gw = got["windows"];
  for (std::size_t i = 0; i < std::max(ww.size(), gw.size()); ++i) {
    if (i >= ww.size() || i >= gw.size() || ww[i] != gw[i])
      return "window " + std::to_string(i) + ": got " + (i < gw.size() ? gw[i].dump() : "none") +
             ", golden " + (i < ww.size() ? ww[i].dump() : "none");
  }
  for (const auto& [key, sha] : want["items"].items()) {
    if (!got["items"].contains(key)) return "item " + key + " missing from the export";
    if (got["items"][key] != sha)
      return "item " + key + ": got " + got["items"][key].dump() + ", golden " + sha.dump();
  }
  for (const auto& [key, sha] : got["items"].items())
    if (!want["items"].contains(key)) return "item " + key + " is new (not in the golden file)";
  return "";
}

TEST(Golden, ExportsAreBitwiseTheRecordedOnes) {
  const bool record =
      std::getenv("LOCKSTEP_GOLDEN_RECORD") != nullptr;  // env: LOCKSTEP_GOLDEN_RECORD
  nlohmann::ordered_json got;
  got["schema"] = kSchema;
  got["schema_version"] = kSchemaVersion;
  got["generator"] =
      "LOCKSTEP_GOLDEN_RECORD=1 build/tests/golden_tests (tests/golden/golden_test.cpp)";
  got["prompt"] = kPrompt;
  for (const Request& r : Requests()) got["requests"][r.name] = RunRequest(r);

  if (record) {
    const std::string tmp = kGoldenPath + ".partial";
    {
      std::ofstream f(tmp);
      f << got.dump(1) << "\n";
      ASSERT_TRUE(f.good()) << "cannot write " << tmp;
    }
    std::filesystem::rename(tmp, kGoldenPath);
    GTEST_SKIP() << "recorded " << kGoldenPath;
  }

  std::ifstream f(kGoldenPath);
  ASSERT_TRUE(f.good()) << "no golden file " << kGoldenPath
                        << " (HINT: LOCKSTEP_GOLDEN_RECORD=1 to record one)";
  nlohmann::ordered_json want =
      nlohmann::ordered_json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(want.is_discarded()) << kGoldenPath << " is not JSON";
  ASSERT_EQ(want.value("schema", ""), kSchema)
      << "HINT: " << kGoldenPath << " is not a golden-exports file";
  ASSERT_EQ(want.value("schema_version", 0), kSchemaVersion)
      << "HINT: re-record with the generator command in the file";
  ASSERT_EQ(want["prompt"], got["prompt"]) << "the requests changed: re-record deliberately";
  std::size_t n_items = 0;
  for (const Request& r : Requests()) {
    SCOPED_TRACE(r.name);
    ASSERT_TRUE(want["requests"].contains(r.name))
        << "request " << r.name << " not in the golden file";
    const auto& w = want["requests"][r.name];
    const auto& g = got["requests"][r.name];
    ASSERT_EQ(w["flags"], g["flags"]) << "the request's flags changed: re-record deliberately";
    // The requests must exercise what the golden test claims to pin, or it guards nothing.
    EXPECT_GT(g["items"].size(), 100u);
    bool mtp = false, sfx = false, wide = false;
    for (const auto& win : g["windows"]) {
      mtp |= win["T_mtp"].get<int>() > 0;
      sfx |= win["from_sfx"].get<bool>();
      wide |= win["T"].get<int>() > 1;
    }
    EXPECT_TRUE(mtp && sfx && wide)
        << "the request no longer drafts from both MTP and the suffix index";
    EXPECT_EQ(FirstDifference(w, g), "")
        << "HINT: a change altered what the engine computes; if deliberate, "
           "re-record (header of tests/golden/golden_test.cpp) and state it";
    n_items += g["items"].size();
  }
  EXPECT_GT(n_items, 1000u);
}

}  // namespace
}  // namespace lockstep
