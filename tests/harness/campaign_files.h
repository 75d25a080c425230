// Reading a campaign run folder in the harness tests: the ledger, JSON files and text, with a
// test failure (not an exception) when a file that must exist does not.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/harness/ledger.h"

namespace lockstep::test {

// The entries of <dir>/ledger.jsonl (none, and a failure, when it cannot be read).
inline std::vector<LedgerEntry> ReadLedger(const std::string& dir) {
  auto l = Ledger::Read(dir + "/ledger.jsonl");
  EXPECT_TRUE(l.ok()) << l.status().message();
  return l.ok() ? l->entries : std::vector<LedgerEntry>{};
}

// The arms of the entries whose event is `event`, in ledger order.
inline std::vector<std::string> Events(const std::vector<LedgerEntry>& es,
                                       const std::string& event) {
  std::vector<std::string> arms;
  for (const auto& e : es)
    if (e.event == event) arms.push_back(e.arm);
  return arms;
}

// A JSON file (null, and a failure, when it cannot be read).
inline nlohmann::json ReadJson(const std::string& path) {
  auto t = ReadFile(path);
  EXPECT_TRUE(t.ok()) << path;
  return t.ok() ? nlohmann::json::parse(*t) : nlohmann::json();
}

// A file's text ("" when it cannot be read: the caller's expectations then fail).
inline std::string Slurp(const std::string& path) {
  auto t = ReadFile(path);
  return t.ok() ? *t : std::string();
}

}  // namespace lockstep::test
