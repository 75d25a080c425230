// Tests for harness/ledger.{h,cpp}: line format and CRC, round trip, torn tails set aside, corrupt
// ledgers refused, failed and short writes (a poisoned handle), and a writer SIGKILLed mid-append.
#include "lockstep/harness/ledger.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/engine/atomic_file.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Slurp(const std::string& path) {
  Result<std::string> r = ReadFile(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

void AppendRaw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f << bytes;
  ASSERT_TRUE(f.good());
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view(bytes)).ok());
}

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::NewDir("lockstep_ledger"); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A ledger with three entries, closed again; returns its bytes.
  std::string MakeThree(const std::string& path) {
    Result<Ledger> l = Ledger::Create(path);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return {};
    EXPECT_TRUE(l->Append("planned", "", {{"plan_sha256", "abc"}}, true).ok());
    EXPECT_TRUE(l->Append("sent", "A", {{"note", "hello"}, {"pid", 42}}, false).ok());
    EXPECT_TRUE(l->Append("finished", "A", {{"exit", 0}, {"ms", 12.5}}, true).ok());
    return Slurp(path);
  }

  // The line Append() would write as entry 3.
  static std::string FourthLine() {
    LedgerEntry e;
    e.seq = 3;
    e.event = "sent";
    e.arm = "B";
    e.data = {{"note", "hello"}, {"pid", 43}};
    return LedgerLine(e);
  }

  // Checks that Read() reports `tail` as torn, Open() sets it aside exactly and appending goes on.
  void ExpectTornTailSetAside(const std::string& tail, const std::string& reason_part) {
    const std::string path = Path("torn.jsonl");
    const std::string good = MakeThree(path);
    AppendRaw(path, tail);

    Result<LedgerLoad> read = Ledger::Read(path);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(read->entries.size(), 3u);
    EXPECT_TRUE(read->torn);
    EXPECT_EQ(read->torn_bytes, static_cast<std::int64_t>(tail.size()));
    EXPECT_TRUE(read->torn_saved_as.empty());
    EXPECT_NE(read->torn_reason.find(reason_part), std::string::npos) << read->torn_reason;
    EXPECT_EQ(Slurp(path), good + tail) << "Read() must not modify the ledger";

    LedgerLoad loaded;
    Result<Ledger> opened = Ledger::Open(path, &loaded);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    EXPECT_TRUE(loaded.torn);
    EXPECT_EQ(loaded.entries.size(), 3u);
    EXPECT_EQ(loaded.torn_saved_as, path + ".torn-1");
    EXPECT_EQ(Slurp(loaded.torn_saved_as), tail);
    EXPECT_EQ(Slurp(path), good) << "the ledger ends at the last good line";
    EXPECT_EQ(opened->next_seq(), 3);

    Result<LedgerEntry> e = opened->Append("compared", "A", {{"verdict", "pass"}}, true);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->seq, 3);
    Result<LedgerLoad> again = Ledger::Read(path);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_FALSE(again->torn);
    ASSERT_EQ(again->entries.size(), 4u);
    EXPECT_EQ(again->entries[3].event, "compared");
    EXPECT_EQ(again->entries[3].data, json({{"verdict", "pass"}}));

    // A second torn tail goes to the next free name, never over the first.
    AppendRaw(path, tail);
    LedgerLoad loaded2;
    Result<Ledger> reopened = Ledger::Open(path, &loaded2);
    ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    EXPECT_EQ(loaded2.torn_saved_as, path + ".torn-2");
    EXPECT_EQ(Slurp(path + ".torn-1"), tail);
    EXPECT_EQ(Slurp(path + ".torn-2"), tail);
    EXPECT_EQ(loaded2.entries.size(), 4u);
  }

  fs::path dir_;
};

TEST(Crc32Test, KnownCheckValue) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);  // the CRC-32/IEEE check value
  EXPECT_EQ(Crc32(""), 0u);
}

TEST(LedgerLineTest, ExactFormat) {
  LedgerEntry e;
  e.seq = 0;
  e.event = "sent";
  e.arm = "a";
  e.data = {{"x", 1}};
  const std::string body = R"({"arm":"a","data":{"x":1},"event":"sent","seq":0})";
  const std::string expected =
      fmt::format(R"({{"arm":"a","crc":"{:08x}","data":{{"x":1}},"event":"sent","seq":0}})",
                  Crc32(body)) +
      "\n";
  EXPECT_EQ(LedgerLine(e), expected);
}

TEST(LedgerLineTest, NullDataIsEmptyObject) {
  LedgerEntry e;
  e.event = "done";
  e.data = json();
  EXPECT_NE(LedgerLine(e).find(R"("data":{})"), std::string::npos) << LedgerLine(e);
}

TEST_F(LedgerTest, RoundTrip) {
  const std::string path = Path("ledger.jsonl");
  const json rich = {{"s", "tab\there \"quoted\" ünïcödé"},
                     {"neg", -7},
                     {"big", 18446744073709551615ull},
                     {"f", 0.1},
                     {"nested", {{"list", {1, 2, 3}}, {"empty", json::object()}}}};
  {
    Result<Ledger> l = Ledger::Create(path);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->next_seq(), 0);
    Result<LedgerEntry> a = l->Append("planned", "", rich, true);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->seq, 0);
    Result<LedgerEntry> b =
        l->Append("sent", "A", {}, false);  // {} at a call site is null: no data
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->seq, 1);
    EXPECT_EQ(b->data, json::object());
    EXPECT_EQ(l->next_seq(), 2);
  }
  const std::string bytes = Slurp(path);
  std::istringstream lines(bytes);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    EXPECT_TRUE(json::accept(line)) << line;
    ++count;
  }
  EXPECT_EQ(count, 2);

  Result<LedgerLoad> r = Ledger::Read(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->torn);
  ASSERT_EQ(r->entries.size(), 2u);
  EXPECT_EQ(r->entries[0].seq, 0);
  EXPECT_EQ(r->entries[0].event, "planned");
  EXPECT_EQ(r->entries[0].arm, "");
  EXPECT_EQ(r->entries[0].data, rich);
  EXPECT_EQ(r->entries[1].seq, 1);
  EXPECT_EQ(r->entries[1].arm, "A");
  EXPECT_EQ(bytes, LedgerLine(r->entries[0]) + LedgerLine(r->entries[1]));

  LedgerLoad loaded;
  Result<Ledger> o = Ledger::Open(path, &loaded);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_FALSE(loaded.torn);
  EXPECT_EQ(loaded.entries.size(), 2u);
  EXPECT_EQ(o->next_seq(), 2);
  Result<LedgerEntry> c = o->Append("done", "", {{"ok", true}}, true);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->seq, 2);
  EXPECT_EQ(Slurp(path), bytes + LedgerLine(*c));
}

TEST_F(LedgerTest, EmptyFileIsValid) {
  const std::string path = Path("empty.jsonl");
  { ASSERT_TRUE(Ledger::Create(path).ok()); }
  Result<LedgerLoad> r = Ledger::Read(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->entries.empty());
  EXPECT_FALSE(r->torn);
  LedgerLoad loaded;
  Result<Ledger> o = Ledger::Open(path, &loaded);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->next_seq(), 0);
}

TEST_F(LedgerTest, CreateRefusesAnExistingLedger) {
  const std::string path = Path("exists.jsonl");
  const std::string bytes = MakeThree(path);
  Result<Ledger> again = Ledger::Create(path);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Status::Code::kInvalidArgument) << again.status().ToString();
  EXPECT_EQ(Slurp(path), bytes) << "a failed Create() must not touch the ledger";
}

TEST_F(LedgerTest, MissingLedgerIsNotFound) {
  EXPECT_EQ(Ledger::Read(Path("nope.jsonl")).status().code(), Status::Code::kNotFound);
  LedgerLoad loaded;
  EXPECT_EQ(Ledger::Open(Path("nope.jsonl"), &loaded).status().code(), Status::Code::kNotFound);
}

TEST_F(LedgerTest, TornTailPartialLineWithoutNewline) {
  const std::string line = FourthLine();
  ExpectTornTailSetAside(line.substr(0, line.size() / 2), "no newline");
}

TEST_F(LedgerTest, TornTailCompleteLineMissingOnlyItsNewline) {
  const std::string line = FourthLine();
  ExpectTornTailSetAside(line.substr(0, line.size() - 1), "no newline");
}

TEST_F(LedgerTest, TornTailFlippedByteIsACrcMismatch) {
  std::string line = FourthLine();
  const std::size_t at = line.find("hello");
  ASSERT_NE(at, std::string::npos);
  line[at + 4] = 'p';  // still valid JSON: only the CRC can tell
  ExpectTornTailSetAside(line, "CRC mismatch");
}

TEST_F(LedgerTest, TornTailTruncatedJsonWithNewline) {
  const std::string line = FourthLine();
  ExpectTornTailSetAside(line.substr(0, line.size() / 3) + "\n", "not JSON");
}

TEST_F(LedgerTest, TornTailZeroFill) {
  // What a crash of the whole machine can leave: the size grew, the data never reached the disk.
  ExpectTornTailSetAside(std::string(100, '\0'), "no newline");
}

TEST_F(LedgerTest, CorruptMiddleLineIsRefused) {
  const std::string path = Path("corrupt.jsonl");
  std::string bytes = MakeThree(path);
  const std::size_t at = bytes.find("hello");  // in line 2
  ASSERT_NE(at, std::string::npos);
  bytes[at] = 'j';
  WriteRaw(path, bytes);

  Result<LedgerLoad> r = Ledger::Read(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kRuntime);
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("CRC mismatch"), std::string::npos) << r.status().ToString();

  LedgerLoad loaded;
  Result<Ledger> o = Ledger::Open(path, &loaded);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), Status::Code::kRuntime);
  EXPECT_EQ(Slurp(path), bytes) << "a corrupt ledger is never modified";
  EXPECT_FALSE(fs::exists(path + ".torn-1"));
}

TEST_F(LedgerTest, BadLineFollowedByAFragmentIsCorrupt) {
  // Only the very last line may be torn; a bad complete line before a fragment is damage.
  const std::string path = Path("two_bad.jsonl");
  const std::string good = MakeThree(path);
  const std::string line = FourthLine();
  WriteRaw(path, good + line.substr(0, 10) + "\n" + line.substr(0, 10));
  Result<LedgerLoad> r = Ledger::Read(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kRuntime);
  EXPECT_NE(r.status().message().find("line 4"), std::string::npos) << r.status().ToString();
}

TEST_F(LedgerTest, WrongSeqOrExtraMembersAreInvalid) {
  const std::string path = Path("seq.jsonl");
  const std::string good = MakeThree(path);
  LedgerEntry e;
  e.seq = 7;  // should be 3
  e.event = "sent";
  const std::string wrong_seq = LedgerLine(e);
  WriteRaw(path, good + wrong_seq + LedgerLine(e));
  Result<LedgerLoad> r = Ledger::Read(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("seq is 7, expected 3"), std::string::npos)
      << r.status().ToString();

  // An extra member, with a CRC that covers it, is still not a ledger line.
  json obj = {{"seq", 3}, {"event", "sent"}, {"arm", ""}, {"data", json::object()}, {"extra", 1}};
  obj["crc"] = fmt::format("{:08x}", Crc32(obj.dump()));
  WriteRaw(path, good + obj.dump() + "\n");
  Result<LedgerLoad> r2 = Ledger::Read(path);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_TRUE(r2->torn);
  EXPECT_NE(r2->torn_reason.find("members"), std::string::npos) << r2->torn_reason;

  // Upper-case hex is not the format either.
  std::string upper = FourthLine();
  const std::size_t at = upper.find("\"crc\":\"") + 7;
  for (std::size_t i = at; i < at + 8; ++i) upper[i] = static_cast<char>(std::toupper(upper[i]));
  if (upper != FourthLine()) {
    WriteRaw(path, good + upper);
    Result<LedgerLoad> r3 = Ledger::Read(path);
    ASSERT_TRUE(r3.ok()) << r3.status().ToString();
    EXPECT_TRUE(r3->torn);
  }
}

TEST_F(LedgerTest, AppendRefusesBadData) {
  const std::string path = Path("bad_data.jsonl");
  Result<Ledger> l = Ledger::Create(path);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Result<LedgerEntry> arr = l->Append("sent", "A", json::array({1, 2}), true);
  EXPECT_EQ(arr.status().code(), Status::Code::kInvalidArgument);
  Result<LedgerEntry> utf = l->Append("sent", "A", {{"s", std::string("\xff\xfe")}}, true);
  EXPECT_EQ(utf.status().code(), Status::Code::kInvalidArgument) << utf.status().ToString();
  Result<LedgerEntry> big =
      l->Append("sent", "A", {{"s", std::string((std::size_t{16} << 20) + 1, 'x')}}, true);
  EXPECT_EQ(big.status().code(), Status::Code::kInvalidArgument) << big.status().ToString();
  EXPECT_EQ(l->next_seq(), 0);
  EXPECT_EQ(Slurp(path), "");
  Result<LedgerEntry> ok = l->Append("sent", "A", {{"s", "fine"}}, true);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->seq, 0);
}

TEST_F(LedgerTest, MovedLedgerKeepsAppending) {
  const std::string path = Path("moved.jsonl");
  Result<Ledger> l = Ledger::Create(path);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Ledger a = std::move(*l);
  ASSERT_TRUE(a.Append("planned", "", {}, true).ok());
  Ledger b = std::move(a);
  ASSERT_TRUE(b.Append("sent", "A", {}, true).ok());
  EXPECT_FALSE(a.Append("sent", "B", {}, true).ok());  // NOLINT(bugprone-use-after-move): the point
  Result<LedgerLoad> r = Ledger::Read(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->entries.size(), 2u);
}

// Runs `fn` with the file size limit at `limit` bytes and SIGXFSZ ignored, so a write past it is
// cut short (or fails with EFBIG) the way a full disk cuts it; both are restored afterwards.
void WithFileSizeLimit(std::size_t limit, const std::function<void()>& fn) {
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct sigaction ignore {
  }, prev{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &prev), 0);
  struct rlimit cut = old;
  cut.rlim_cur = static_cast<rlim_t>(limit);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &cut), 0);
  fn();
  EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_EQ(::sigaction(SIGXFSZ, &prev, nullptr), 0);
}

// ledger.h "How failures surface": a write() that writes nothing leaves the handle usable; a
// short write leaves a torn last line and poisons the handle until Open() sets the tail aside.
TEST_F(LedgerTest, FailedAndShortWritesSurfaceAsStated) {
  const std::string path = Path("short.jsonl");
  const std::string good = MakeThree(path);
  Result<Ledger> l = Ledger::Open(path, nullptr);
  ASSERT_TRUE(l.ok()) << l.status().ToString();

  const Status not_run = Status::Runtime("test", "not run");
  Result<LedgerEntry> nothing = not_run;
  WithFileSizeLimit(good.size(), [&] { nothing = l->Append("sent", "B", {{"n", 1}}, true); });
  EXPECT_EQ(nothing.status().code(), Status::Code::kIOError) << nothing.status().ToString();
  EXPECT_EQ(Slurp(path), good) << "a write of nothing leaves the file as it was";
  Result<LedgerEntry> usable = l->Append("sent", "B", {{"n", 2}}, true);
  ASSERT_TRUE(usable.ok()) << usable.status().ToString();
  EXPECT_EQ(usable->seq, 3);
  const std::string four = Slurp(path);

  Result<LedgerEntry> cut = not_run, after = not_run;
  WithFileSizeLimit(four.size() + 10, [&] {
    cut = l->Append("finished", "B", {{"exit", 0}}, true);
    after = l->Append("sent", "C", {}, true);
  });
  EXPECT_EQ(cut.status().code(), Status::Code::kIOError);
  EXPECT_NE(cut.status().message().find("short write"), std::string::npos)
      << cut.status().ToString();
  EXPECT_EQ(after.status().code(), Status::Code::kIOError);
  EXPECT_NE(after.status().message().find("reopen"), std::string::npos)
      << after.status().ToString();
  EXPECT_FALSE(l->Append("sent", "C", {}, true).ok()) << "poisoned until reopened, limit or not";
  EXPECT_EQ(Slurp(path).size(), four.size() + 10);

  LedgerLoad loaded;
  Result<Ledger> reopened = Ledger::Open(path, &loaded);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_TRUE(loaded.torn);
  EXPECT_EQ(loaded.torn_bytes, 10);
  EXPECT_EQ(loaded.entries.size(), 4u);
  Result<LedgerEntry> next = reopened->Append("finished", "B", {{"exit", 0}}, true);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->seq, 4);
}

// A writer killed at a random moment (SIGKILL: no cleanup, possibly in the middle of a write())
// leaves a ledger that Open() accepts: every complete line valid, at most a torn tail.
TEST_F(LedgerTest, KilledWriterLeavesAnOpenableLedger) {
  std::mt19937 rng(20240611u);
  std::uniform_int_distribution<int> delay_us(1000, 60000);
  int torn_seen = 0;
  for (int round = 0; round < 20; ++round) {
    const std::string path = Path(fmt::format("killed_{}.jsonl", round));
    { ASSERT_TRUE(Ledger::Create(path).ok()); }
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: append until killed, lines from tiny to 256 KiB so that the kill can land inside a
      // long write() (most of the child's time goes to dump(), so that is a matter of luck).
      // _exit: never run the parent's gtest teardown or atexit handlers.
      LedgerLoad loaded;
      Result<Ledger> l = Ledger::Open(path, &loaded);
      if (!l.ok()) ::_exit(3);
      std::mt19937 child_rng(static_cast<unsigned>(round));
      for (int i = 0; i < 1000000; ++i) {
        const std::size_t size = (i % 3 == 0) ? (child_rng() % (1u << 18)) : (child_rng() % 200);
        if (!l->Append("sent", fmt::format("arm{}", i), {{"i", i}, {"pad", std::string(size, 'p')}},
                       i % 5 == 0)
                 .ok()) {
          ::_exit(4);
        }
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_FALSE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)
        << "child failed: exit " << WEXITSTATUS(wstatus);

    const std::string before = Slurp(path);
    LedgerLoad loaded;
    Result<Ledger> o = Ledger::Open(path, &loaded);
    ASSERT_TRUE(o.ok()) << "round " << round << ": " << o.status().ToString();
    const std::string after = Slurp(path);
    if (loaded.torn) {
      ++torn_seen;
      EXPECT_EQ(Slurp(loaded.torn_saved_as), before.substr(after.size())) << "round " << round;
      EXPECT_EQ(before.substr(0, after.size()), after);
    } else {
      EXPECT_EQ(before, after);
    }
    for (std::size_t i = 0; i < loaded.entries.size(); ++i) {
      EXPECT_EQ(loaded.entries[i].seq, static_cast<std::int64_t>(i));
      EXPECT_EQ(loaded.entries[i].arm, fmt::format("arm{}", i));
    }
    const auto n = static_cast<std::int64_t>(loaded.entries.size());
    EXPECT_EQ(o->next_seq(), n);
    Result<LedgerEntry> e = o->Append("resumed", "", {}, true);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->seq, n);
    Result<LedgerLoad> r = Ledger::Read(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->torn);
    EXPECT_EQ(r->entries.size(), loaded.entries.size() + 1);
  }
  // Not asserted (a kill inside a write() is a matter of luck), but worth seeing in the log.
  std::cout << "[ledger] torn tails after SIGKILL: " << torn_seen << " of 20\n";
}

}  // namespace
}  // namespace lockstep
