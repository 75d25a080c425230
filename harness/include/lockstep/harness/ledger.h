// Request ledger: the crash-safe record of a campaign run (DESIGN.md "harness/").
//
// Append-only JSON lines, one per state change. Each line is one write() of
//   {"seq":N,"event":"...","arm":"...","data":{...},"crc":"xxxxxxxx"}\n
// where crc is the CRC-32 (zlib polynomial, 8 lowercase hex digits) of the same line serialised
// without the "crc" member (nlohmann dump(), keys sorted). Append(..., sync=true) fdatasync()s
// the file (decision points). On load, a torn last line (no newline, not JSON, or a CRC mismatch
// in the last line) is reported and set aside (moved to `<ledger>.torn-<k>` and cut from the
// ledger); a bad line anywhere else means the ledger is corrupt (kRuntime) and is never trusted.
//
// Thread safety: a Ledger is thread-compatible (no lock): one thread appends at a time. Nothing
// locks the file either, so a ledger has one writer process: a second process appending to it
// would repeat seq numbers, and Read() / Open() take a line with the wrong seq for corruption
// (kRuntime), or for a torn tail when it is the last line. Read() may run while another process
// appends: a line still being written reads as a torn last line (reported; only Open() moves it).
// Crc32() and LedgerLine() are pure.
//
// How failures surface:
//   - Append() that fails before writing (bad data, write() returning -1) leaves the file as it
//     was and the handle usable; one that fails part-way (a short write, a failed fdatasync)
//     leaves at most a torn last line and poisons the handle: every later Append() is kIOError
//     until the ledger is opened again.
//   - A crash during Append() leaves a torn last line. Open() saves its bytes to
//     `<ledger>.torn-<k>`, cuts the ledger to its last good line and reports it in LedgerLoad
//     (torn, torn_saved_as, torn_bytes, torn_reason); Read() reports it and changes nothing.
//   - Damage anywhere before the last line is kRuntime ("ledger '...' is corrupt"): no entry of
//     that file is returned.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

struct LedgerEntry {
  std::int64_t seq = 0;  // 0, 1, 2, ... in file order
  std::string event;     // planned | sent | finished | failed | compared | decision | not_sent |
                         // stopped | done | resumed
  std::string arm;       // "" for campaign-level events
  nlohmann::json data = nlohmann::json::object();
};

struct LedgerLoad {
  std::vector<LedgerEntry> entries;
  bool torn = false;          // a torn last line was found and set aside
  std::string torn_saved_as;  // where its bytes went
  std::int64_t torn_bytes = 0;
  std::string torn_reason;  // why the last line was judged torn ("line 7: CRC mismatch (...)")
};

// CRC-32 (IEEE, as zlib's crc32()) of bytes.
std::uint32_t Crc32(std::string_view bytes);
// The exact line (with "\n") for an entry (null data is written as {}; a string that is not
// UTF-8 is written with U+FFFD, which Append() refuses instead).
std::string LedgerLine(const LedgerEntry& e);

class Ledger {
 public:
  // Creates a new ledger file (kInvalidArgument if it exists) and fsyncs its folder.
  static Result<Ledger> Create(const std::string& path);
  // Opens an existing ledger for appending after Load() (sets aside a torn tail first: its bytes
  // go to the first free `<path>.torn-<k>`, k = 1, 2, ..., then the ledger is cut to its last
  // good line). next_seq() is then the number of entries.
  static Result<Ledger> Open(const std::string& path, LedgerLoad* loaded);
  // Reads and checks a ledger without modifying it (torn tail reported, not moved).
  static Result<LedgerLoad> Read(const std::string& path);

  Ledger(Ledger&&) noexcept;
  Ledger& operator=(Ledger&&) noexcept;
  ~Ledger();

  // Appends one entry (seq assigned here) with one write(); fdatasync when sync.
  // `data` must be a JSON object (null is taken as {}). Errors: kInvalidArgument (data not an
  // object, a string that is not UTF-8, a line over 16 MiB: nothing written); kIOError (write or
  // fdatasync failed; after a short write or a failed fdatasync this handle refuses further
  // appends: Open() the ledger again, which sets the torn tail aside).
  Result<LedgerEntry> Append(const std::string& event, const std::string& arm,
                             const nlohmann::json& data, bool sync);
  std::int64_t next_seq() const { return next_seq_; }
  const std::string& path() const { return path_; }

 private:
  Ledger(int fd, std::string path, std::int64_t next_seq);
  int fd_ = -1;
  std::string path_;
  std::int64_t next_seq_ = 0;
  bool poisoned_ = false;  // a write was cut short or fdatasync failed: refuse further appends
};

}  // namespace lockstep
