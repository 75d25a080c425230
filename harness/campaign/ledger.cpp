#include "lockstep/harness/ledger.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>
#include <utility>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/errno_text.h"

namespace lockstep {
namespace {

using json = nlohmann::json;

// A ledger line is a few hundred bytes in practice; the guard only keeps a damaged file (or a
// runaway `data` payload) from making us parse gigabytes as one line.
constexpr std::size_t kMaxLineBytes = std::size_t{16} << 20;
// Nesting deeper than this is not something the harness writes; nlohmann's dump() recurses, so a
// crafted line of a million '[' would otherwise overflow the stack while we check its CRC.
constexpr int kMaxDepth = 512;
// The whole ledger is read into memory; a campaign writes a few kilobytes.
constexpr std::size_t kMaxLedgerBytes = std::size_t{1} << 30;

// Reads the whole of `fd` from offset 0 (pread: the file offset of an O_APPEND descriptor does
// not matter, and we do not disturb it).
Result<std::string> ReadAll(int fd, const std::string& path) {
  const std::string what = fmt::format("reading ledger '{}'", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return Status::IOError(what, fmt::format("fstat: {}", ErrnoText(errno)));
  if (!S_ISREG(st.st_mode)) return Status::IOError(what, "not a regular file");
  const auto size = static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 0);
  if (size > kMaxLedgerBytes) {
    return Status::InvalidArgument(
        what, fmt::format("{} bytes, more than the limit of {}", size, kMaxLedgerBytes));
  }
  std::string out(size, '\0');
  std::size_t got = 0;
  while (got < size) {
    const ssize_t r = ::pread(fd, out.data() + got, size - got, static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(what, ErrnoText(errno));
    }
    if (r == 0) break;  // shrank under us: judge what is there
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  return out;
}

// The canonical form of an entry without its crc: the bytes the CRC covers. nlohmann's object is
// a std::map, so dump() writes the keys sorted and the text does not depend on insertion order.
json EntryObject(std::int64_t seq, const std::string& event, const std::string& arm,
                 const json& data) {
  json obj = json::object();
  obj["seq"] = seq;
  obj["event"] = event;
  obj["arm"] = arm;
  // A default-constructed json (what `{}` at a call site gives) is null; it means "no data".
  obj["data"] = data.is_null() ? json::object() : data;
  return obj;
}

std::string CrcHex(std::uint32_t crc) { return fmt::format("{:08x}", crc); }

// `obj` (no crc member) -> the full line. `handler` decides what an invalid UTF-8 string does:
// strict throws (Append refuses the entry), replace writes U+FFFD (LedgerLine cannot fail).
std::string LineFromObject(json obj, json::error_handler_t handler) {
  const std::string body = obj.dump(-1, ' ', false, handler);
  obj["crc"] = CrcHex(Crc32(body));
  std::string line = obj.dump(-1, ' ', false, handler);
  line.push_back('\n');
  return line;
}

bool IsLowerHex8(const std::string& s) {
  return s.size() == 8 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Checks one line (without its '\n') that should hold entry number `index`. Returns why it is
// invalid, or nullopt with *entry filled.
std::optional<std::string> CheckLine(std::string_view line, std::int64_t index,
                                     LedgerEntry* entry) {
  if (line.size() > kMaxLineBytes) return fmt::format("longer than {} bytes", kMaxLineBytes);
  bool too_deep = false;
  const json::parser_callback_t depth_guard = [&too_deep](int depth, json::parse_event_t, json&) {
    if (depth > kMaxDepth) too_deep = true;
    return !too_deep;  // stop building values once we know the line is rejected
  };
  json j;
  try {
    j = json::parse(line.begin(), line.end(), depth_guard, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {  // allow_exceptions=false should make this unreachable
    return fmt::format("not JSON ({})", e.what());
  }
  if (too_deep) return fmt::format("nested deeper than {} levels", kMaxDepth);
  if (j.is_discarded()) return std::string("not JSON");
  if (!j.is_object()) return std::string("not a JSON object");
  static constexpr const char* kMembers[] = {"arm", "crc", "data", "event", "seq"};
  bool members_ok = j.size() == std::size(kMembers);
  for (const char* m : kMembers) members_ok = members_ok && j.contains(m);
  if (!members_ok) return std::string("members must be exactly seq, event, arm, data and crc");
  if (!j["seq"].is_number_integer()) return std::string("seq is not an integer");
  if (!j["event"].is_string()) return std::string("event is not a string");
  if (!j["arm"].is_string()) return std::string("arm is not a string");
  if (!j["data"].is_object()) return std::string("data is not an object");
  if (!j["crc"].is_string() || !IsLowerHex8(j["crc"].get_ref<const std::string&>())) {
    return std::string("crc is not 8 lowercase hex digits");
  }
  const std::string stored = j["crc"].get<std::string>();
  j.erase("crc");
  std::string body;
  try {
    body = j.dump();  // the parser only accepts valid UTF-8, so strict dumping cannot throw here
  } catch (const std::exception& e) {
    return fmt::format("cannot re-serialise ({})", e.what());
  }
  const std::string computed = CrcHex(Crc32(body));
  if (computed != stored)
    return fmt::format("CRC mismatch (stored {}, computed {})", stored, computed);
  // nlohmann parses non-negative integers as unsigned; compare without a narrowing cast.
  const json& seq = j["seq"];
  const bool seq_ok = seq.is_number_unsigned()
                          ? seq.get<std::uint64_t>() == static_cast<std::uint64_t>(index)
                          : seq.get<std::int64_t>() == index;
  if (!seq_ok) return fmt::format("seq is {}, expected {} (its line index)", seq.dump(), index);
  entry->seq = index;
  entry->event = j["event"].get<std::string>();
  entry->arm = j["arm"].get<std::string>();
  entry->data = std::move(j["data"]);
  return std::nullopt;
}

// What a scan of the ledger bytes found. Lines [0, good_end) are all valid; bytes from good_end
// on are the torn tail (if any).
struct Scan {
  LedgerLoad load;
  std::size_t good_end = 0;
};

Result<Scan> ScanLedger(const std::string& bytes, const std::string& path) {
  Scan scan;
  std::size_t pos = 0;
  std::int64_t index = 0;
  while (pos < bytes.size()) {
    const std::size_t nl = bytes.find('\n', pos);
    std::optional<std::string> bad;
    LedgerEntry entry;
    if (nl == std::string::npos) {
      // One write() per line: a line without its newline is a write that did not finish.
      bad = fmt::format("no newline at the end ({} bytes)", bytes.size() - pos);
    } else {
      bad = CheckLine(std::string_view(bytes).substr(pos, nl - pos), index, &entry);
    }
    if (bad) {
      const bool last = nl == std::string::npos || nl + 1 == bytes.size();
      if (!last) {
        // Only the last write can be cut short by a crash; damage before it is something else
        // (a disk error, an editor, a second writer) and nothing in the file can be trusted.
        return Status::Runtime(fmt::format("ledger '{}' is corrupt", path),
                               fmt::format("line {} (seq {}): {}; only the last line may be torn",
                                           index + 1, index, *bad));
      }
      scan.load.torn = true;
      scan.load.torn_reason = fmt::format("line {}: {}", index + 1, *bad);
      scan.load.torn_bytes = static_cast<std::int64_t>(bytes.size() - pos);
      break;
    }
    scan.load.entries.push_back(std::move(entry));
    pos = nl + 1;
    scan.good_end = pos;
    ++index;
  }
  return scan;
}

// Writes the torn tail next to the ledger under the first free `<path>.torn-<k>` (k = 1, 2, ...)
// so that no byte is ever lost: a later look can still tell what the crashed writer was doing.
Result<std::string> SaveTorn(const std::string& path, std::string_view bytes) {
  for (int k = 1; k < 100000; ++k) {
    const std::string candidate = fmt::format("{}.torn-{}", path, k);
    struct stat st {};
    if (::lstat(candidate.c_str(), &st) == 0) continue;
    if (errno != ENOENT) {
      return Status::IOError(fmt::format("setting aside the torn tail of ledger '{}'", path),
                             fmt::format("lstat '{}': {}", candidate, ErrnoText(errno)));
    }
    LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(candidate, bytes));
    return candidate;
  }
  return Status::Runtime(fmt::format("setting aside the torn tail of ledger '{}'", path),
                         "no free '.torn-<k>' name below 100000");
}

}  // namespace

std::uint32_t Crc32(std::string_view bytes) {
  // crc32() takes a uInt length; feed it in chunks so a view over 4 GiB is still right.
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  std::size_t n = bytes.size();
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  while (n > 0) {
    const std::size_t take = std::min(n, kChunk);
    crc = ::crc32(crc, p, static_cast<uInt>(take));
    p += take;
    n -= take;
  }
  return static_cast<std::uint32_t>(crc);
}

std::string LedgerLine(const LedgerEntry& e) {
  return LineFromObject(EntryObject(e.seq, e.event, e.arm, e.data), json::error_handler_t::replace);
}

Ledger::Ledger(int fd, std::string path, std::int64_t next_seq)
    : fd_(fd), path_(std::move(path)), next_seq_(next_seq) {}

Ledger::Ledger(Ledger&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      next_seq_(other.next_seq_),
      poisoned_(other.poisoned_) {}

Ledger& Ledger::operator=(Ledger&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    next_seq_ = other.next_seq_;
    poisoned_ = other.poisoned_;
  }
  return *this;
}

Ledger::~Ledger() {
  if (fd_ >= 0) ::close(fd_);
}

Result<Ledger> Ledger::Create(const std::string& path) {
  const std::string what = fmt::format("creating ledger '{}'", path);
  // O_EXCL: a ledger is never overwritten; an existing one is resumed through Open().
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return Status::InvalidArgument(
          what, "a ledger already exists there (hint: resume it instead of starting over)");
    }
    return Status::IOError(what, ErrnoText(err));
  }
  Ledger ledger(fd, path, 0);
  // The file must still exist after a crash, or the first (fsynced) entries would vanish with it.
  if (const int err = FsyncDir(ParentDir(path)); err != 0) {
    return Status::IOError(
        what, fmt::format("fsync of folder '{}': {}", ParentDir(path), ErrnoText(err)));
  }
  return ledger;
}

Result<LedgerLoad> Ledger::Read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(fmt::format("ledger '{}'", path), "does not exist");
    return Status::IOError(fmt::format("reading ledger '{}'", path), ErrnoText(err));
  }
  Result<std::string> bytes = ReadAll(fd, path);
  ::close(fd);
  if (!bytes.ok()) return bytes.status();
  LOCKSTEP_ASSIGN_OR_RETURN(Scan scan, ScanLedger(*bytes, path));
  return std::move(scan.load);
}

Result<Ledger> Ledger::Open(const std::string& path, LedgerLoad* loaded) {
  const std::string what = fmt::format("opening ledger '{}'", path);
  // One descriptor for reading, cutting and appending: what we judge is what we cut.
  const int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(fmt::format("ledger '{}'", path), "does not exist");
    return Status::IOError(what, ErrnoText(err));
  }
  Ledger ledger(fd, path, 0);  // owns fd from here on: every error path below closes it
  LOCKSTEP_ASSIGN_OR_RETURN(std::string bytes, ReadAll(fd, path));
  LOCKSTEP_ASSIGN_OR_RETURN(Scan scan, ScanLedger(bytes, path));
  if (scan.load.torn) {
    // Save first, cut second: a crash in between leaves the tail in place and the next Open()
    // saves it again (a duplicate .torn file, never a lost byte).
    LOCKSTEP_ASSIGN_OR_RETURN(scan.load.torn_saved_as,
                              SaveTorn(path, std::string_view(bytes).substr(scan.good_end)));
    if (::ftruncate(fd, static_cast<off_t>(scan.good_end)) != 0) {
      return Status::IOError(what,
                             fmt::format("cutting the torn tail: ftruncate: {}", ErrnoText(errno)));
    }
    if (::fsync(fd) != 0) {
      return Status::IOError(what,
                             fmt::format("cutting the torn tail: fsync: {}", ErrnoText(errno)));
    }
  }
  ledger.next_seq_ =
      static_cast<std::int64_t>(scan.load.entries.size());  // seq == line index, checked
  if (loaded != nullptr) *loaded = std::move(scan.load);
  return ledger;
}

Result<LedgerEntry> Ledger::Append(const std::string& event, const std::string& arm,
                                   const nlohmann::json& data, bool sync) {
  const std::string what = fmt::format("appending '{}' to ledger '{}'", event, path_);
  if (fd_ < 0) return Status::Runtime(what, "the ledger was moved from");
  if (poisoned_) {
    return Status::IOError(
        what, "an earlier append failed part-way; reopen the ledger to set its torn tail aside");
  }
  if (!data.is_null() && !data.is_object()) {
    return Status::InvalidArgument(
        what, fmt::format("data must be a JSON object, got {}", data.type_name()));
  }
  std::string line;
  try {
    line = LineFromObject(EntryObject(next_seq_, event, arm, data), json::error_handler_t::strict);
  } catch (const std::exception& e) {
    // The only thing dump() rejects is a string that is not UTF-8; writing it replaced would
    // record something other than what the caller said.
    return Status::InvalidArgument(what, fmt::format("cannot serialise the entry: {}", e.what()));
  }
  if (line.size() - 1 > kMaxLineBytes) {
    return Status::InvalidArgument(
        what, fmt::format("line of {} bytes, over the limit of {} that Read() accepts", line.size(),
                          kMaxLineBytes));
  }
  // One write(): a crash leaves either the whole line or a prefix of it (a torn tail that Open()
  // sets aside), never a line with a later one interleaved. A short write is not continued with
  // a second write() for the same reason; it leaves a torn tail and poisons this handle.
  for (;;) {
    const ssize_t w = ::write(fd_, line.data(), line.size());
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;  // -1: nothing was written, the file is as it was
      return Status::IOError(what,
                             fmt::format("write: {} (hint: is the disk full?)", ErrnoText(err)));
    }
    if (static_cast<std::size_t>(w) != line.size()) {
      poisoned_ = true;
      return Status::IOError(
          what,
          fmt::format("short write: {} of {} bytes (hint: is the disk full?)", w, line.size()));
    }
    break;
  }
  if (sync && ::fdatasync(fd_) != 0) {
    // After a failed fdatasync the kernel may have dropped the dirty pages: what is on disk is
    // unknown, so this handle must not go on as if the line were there.
    const int err = errno;
    poisoned_ = true;
    return Status::IOError(what, fmt::format("fdatasync: {}", ErrnoText(err)));
  }
  LedgerEntry entry;
  entry.seq = next_seq_++;
  entry.event = event;
  entry.arm = arm;
  entry.data = data.is_null() ? json::object() : data;
  return entry;
}

}  // namespace lockstep
