// POST /slots/{id}?action=save|restore|erase on `lockstep serve` (slot_actions.h): a conversation
// kept by a request ("lockstep": {"keep": true}), saved to a slot file, restored on a fresh
// server and continued ("id_slot") gives bitwise the tokens of the live continuation (and of
// `generate --restore-slot`); bad files, names, slots and states are refused with their status
// and the server keeps serving.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "serve_process.h"
#include "test_util.h"

namespace lockstep::test {
namespace {

using nlohmann::json;

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", ModelDir("tiny"), "--port", "0", "--threads",
                                "1",       "--slots",        "2"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<int> Ids(const Answer& a) {
  return a.body["lockstep"]["output_ids"].get<std::vector<int>>();
}

json SlotState(httplib::Client& cli, int slot) {
  return json::parse(cli.Get("/slots")->body)["slots"][slot];
}

std::vector<int> Prompt() {
  std::vector<int> p;
  for (int i = 0; i < 40; ++i) p.push_back((i * 29 + 3) % 500);
  return p;
}
const std::vector<int> kMore = {11, 22, 33, 44, 55};

json Turn(const std::vector<int>& prompt) {
  return {{"prompt", prompt},
          {"max_tokens", 16},
          {"temperature", 0.8},
          {"seed", 3},
          {"ignore_eos", true}};
}

TEST(ServeSlots, SavedConversationContinuesBitwiseOnAFreshServer) {
  const std::string dir = NewDir("slots");
  std::vector<int> out1, live;
  {
    ServeProcess a(Args({"--slot-dir", dir}));
    ASSERT_TRUE(a.started()) << a.Log();
    auto cli = a.Client();
    json first = Turn(Prompt());
    first["lockstep"] = {{"keep", true}};
    const Answer r1 = Post(*cli, "/v1/completions", first);
    ASSERT_EQ(r1.status, 200) << r1.body;
    out1 = Ids(r1);
    const int slot = r1.body["lockstep"]["slot"].get<int>();
    const json st = SlotState(*cli, slot);
    EXPECT_EQ(st["state"], "kept") << st;
    EXPECT_EQ(st["n_tokens"], 40 + 16) << st;
    const Answer saved =
        Post(*cli, "/slots/" + std::to_string(slot) + "?action=save", {{"filename", "conv.slot"}});
    ASSERT_EQ(saved.status, 200) << saved.body;
    EXPECT_EQ(saved.body["n_saved"], 40 + 16);
    EXPECT_EQ(saved.body["n_written"], std::filesystem::file_size(dir + "/conv.slot"));
    // The live continuation: the whole conversation so far, then new tokens.
    std::vector<int> next = Prompt();
    next.insert(next.end(), out1.begin(), out1.end());
    next.insert(next.end(), kMore.begin(), kMore.end());
    json cont = Turn(next);
    cont["id_slot"] = slot;
    const Answer r2 = Post(*cli, "/v1/completions", cont);
    ASSERT_EQ(r2.status, 200) << r2.body;
    live = Ids(r2);
    EXPECT_EQ(r2.body["lockstep"]["slot"], slot);
    // The slot held the conversation but its last token: those positions are not recomputed.
    EXPECT_EQ(r2.body["lockstep"]["slot_tokens_reused"], 40 + 16 - 1) << r2.body;
    EXPECT_EQ(r2.body["usage"]["prompt_tokens_details"]["cached_tokens"], 40 + 16 - 1);
    EXPECT_EQ(r1.body["lockstep"]["slot_tokens_reused"], 0);
    EXPECT_EQ(SlotState(*cli, slot)["state"], "idle");  // no keep: released at its end
  }
  std::vector<int> next = Prompt();
  next.insert(next.end(), out1.begin(), out1.end());
  next.insert(next.end(), kMore.begin(), kMore.end());
  ServeProcess b(Args({"--slot-dir", dir}));
  ASSERT_TRUE(b.started()) << b.Log();
  auto cli = b.Client();
  const Answer restored = Post(*cli, "/slots/1?action=restore", {{"filename", "conv.slot"}});
  ASSERT_EQ(restored.status, 200) << restored.body;
  EXPECT_EQ(restored.body["n_restored"], 40 + 16);
  EXPECT_EQ(SlotState(*cli, 1)["state"], "kept");
  EXPECT_EQ(SlotState(*cli, 0)["state"], "idle");
  json cont = Turn(next);
  cont["id_slot"] = 1;
  const Answer r2 = Post(*cli, "/v1/completions", cont);
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(Ids(r2), live);
  EXPECT_EQ(r2.body["lockstep"]["slot_tokens_reused"], 40 + 16 - 1);  // restored: the same
  // `lockstep generate --restore-slot` continues the same file to the same tokens.
  const std::string more = NewDir("slots-more") + "/more.txt";
  std::ofstream(more) << "11 22 33 44 55";
  const CmdResult g =
      RunLockstep("generate --model " + ModelDir("tiny") + " --threads 1 --restore-slot " + dir +
                  "/conv.slot --prompt-tokens " + more +
                  " --max-new 16 --temperature 0.8 --seed 3 --ignore-eos --json -");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(json::parse(g.out)["output_ids"].get<std::vector<int>>(), live);
}

TEST(ServeSlots, RefusalsLeaveTheServerServing) {
  const std::string dir = NewDir("slots-bad");
  // --keep-max 2: both slots hold a conversation at the end (the default, slots - 1, would
  // release the first when the second is restored).
  ServeProcess srv(Args({"--slot-dir", dir, "--keep-max", "2"}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  json keep = Turn(Prompt());
  keep["lockstep"] = {{"keep", true}};
  const Answer r1 = Post(*cli, "/v1/completions", keep);
  ASSERT_EQ(r1.status, 200) << r1.body;
  const int slot = r1.body["lockstep"]["slot"].get<int>();
  ASSERT_EQ(
      Post(*cli, "/slots/" + std::to_string(slot) + "?action=save", {{"filename", "good"}}).status,
      200);
  // Damaged copies of the good file.
  std::ifstream in(dir + "/good", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string good = ss.str();
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x5a;
  std::ofstream(dir + "/flipped", std::ios::binary) << flipped;
  std::ofstream(dir + "/short", std::ios::binary) << good.substr(0, good.size() / 3);
  std::ofstream(dir + "/empty", std::ios::binary) << "";
  std::ofstream(dir + "/text", std::ios::binary) << "not a slot file at all";
  const int free_slot = 1 - slot;
  struct Case {
    std::string path;
    json body;
    int status;
    std::string code;
  };
  const std::string fs = "/slots/" + std::to_string(free_slot);
  const std::string ks = "/slots/" + std::to_string(slot);
  const std::vector<Case> cases = {
      {fs + "?action=restore", {{"filename", "flipped"}}, 400, "invalid_slot_file"},
      {fs + "?action=restore", {{"filename", "short"}}, 400, "invalid_slot_file"},
      {fs + "?action=restore", {{"filename", "empty"}}, 400, "invalid_slot_file"},
      {fs + "?action=restore", {{"filename", "text"}}, 400, "invalid_slot_file"},
      {fs + "?action=restore", {{"filename", "missing"}}, 404, "slot_file_not_found"},
      {fs + "?action=restore", {{"filename", "../good"}}, 400, "invalid_value"},
      {fs + "?action=restore", {{"filename", "sub/good"}}, 400, "invalid_value"},
      {fs + "?action=restore", {{"filename", ".good"}}, 400, "invalid_value"},
      {fs + "?action=restore", {{"filename", ""}}, 400, "invalid_value"},
      {fs + "?action=restore", {{"filename", 7}}, 400, "invalid_type"},
      {fs + "?action=restore", {{"filename", "good"}, {"path", "/etc"}}, 400, "unknown_field"},
      {fs + "?action=restore", json::array(), 400, "invalid_json"},
      {ks + "?action=restore", {{"filename", "good"}}, 409, "slot_not_free"},
      {fs + "?action=save", {{"filename", "x"}}, 409, "slot_not_kept"},
      {fs + "?action=bogus", {{"filename", "x"}}, 400, "invalid_value"},
      {fs, {{"filename", "x"}}, 400, "invalid_value"},
      {"/slots/99?action=erase", json::object(), 400, "invalid_slot"},
      {"/slots/99999999999999999999?action=erase", json::object(), 400, "invalid_slot"},
  };
  for (const Case& c : cases) {
    const Answer a = Post(*cli, c.path, c.body);
    EXPECT_EQ(a.status, c.status) << c.path << " " << c.body << ": " << a.body;
    EXPECT_EQ(a.body["error"]["code"], c.code) << c.path << " " << c.body << ": " << a.body;
    EXPECT_EQ(SlotState(*cli, free_slot)["state"], "idle") << c.path << " " << c.body;
    EXPECT_EQ(SlotState(*cli, slot)["state"], "kept") << c.path << " " << c.body;
    EXPECT_EQ(Post(*cli, "/v1/completions", {{"prompt", {1, 2}}, {"max_tokens", 2}}).status, 200)
        << c.path;
  }
  // A continuation must continue: the wrong tokens, or a slot that holds nothing.
  json wrong = Turn({1, 2, 3});
  wrong["id_slot"] = slot;
  Answer a = Post(*cli, "/v1/completions", wrong);
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_EQ(a.body["error"]["code"], "prompt_not_continuation");
  wrong["id_slot"] = free_slot;
  a = Post(*cli, "/v1/completions", wrong);
  EXPECT_EQ(a.status, 409) << a.body;
  // The good file still restores; erase frees both slots.
  a = Post(*cli, fs + "?action=restore", {{"filename", "good"}});
  EXPECT_EQ(a.status, 200) << a.body;
  a = Post(*cli, ks + "?action=erase", json::object());
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body["n_erased"], 40 + 16);
  a = Post(*cli, fs + "?action=erase", json::object());
  EXPECT_EQ(a.body["n_erased"], 40 + 16);
  a = Post(*cli, fs + "?action=erase", json::object());
  EXPECT_EQ(a.body["n_erased"], 0);
  EXPECT_EQ(SlotState(*cli, 0)["state"], "idle");
  EXPECT_EQ(SlotState(*cli, 1)["state"], "idle");
  // The log never names the slot folder.
  EXPECT_EQ(srv.Log().find(dir), std::string::npos);
  // Without --slot-dir, save and restore are not available (erase is).
  ServeProcess plain(Args({}));
  ASSERT_TRUE(plain.started());
  auto pc = plain.Client();
  EXPECT_EQ(Post(*pc, "/slots/0?action=save", {{"filename", "x"}}).status, 501);
  EXPECT_EQ(Post(*pc, "/slots/0?action=restore", {{"filename", "x"}}).status, 501);
  EXPECT_EQ(Post(*pc, "/slots/0?action=erase", json::object()).status, 200);
}

// Issue 43: a FIFO, a symbolic link (to a file in the folder or out of it), a folder and a
// device node as a slot name are each refused at once with 400 (a FIFO wedged the engine's
// thread; links were followed out of the folder), and the engine keeps serving.
TEST(ServeSlots, NonRegularAndLinkedSlotFilesAreRefusedAtOnce) {
  const std::string dir = NewDir("slots-hostile");
  const std::string outside = NewDir("slots-outside") + "/secret";
  std::ofstream(outside) << "not a slot";
  std::ofstream(dir + "/plain") << "not a slot either";
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (dir + "/out").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/plain").c_str(), (dir + "/in").c_str()), 0);
  std::filesystem::create_directory(dir + "/sub");
  const std::string kLink = "symbolic link", kNotRegular = "not a regular file";
  std::vector<std::pair<std::string, std::string>> names = {
      {"fifo", kNotRegular}, {"out", kLink}, {"in", kLink}, {"sub", kNotRegular}};
  if (::mknod((dir + "/dev").c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0)
    names.emplace_back("dev", kNotRegular);
  ServeProcess srv(Args({"--slot-dir", dir}));
  ASSERT_TRUE(srv.started()) << srv.Log();
  auto cli = srv.Client();
  for (const auto& [n, why] : names) {
    const auto t0 = std::chrono::steady_clock::now();
    const Answer a = Post(*cli, "/slots/0?action=restore", {{"filename", n}});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(a.status, 400) << n << ": " << a.body.dump();
    EXPECT_NE(a.body.dump().find(why), std::string::npos) << n << ": " << a.body.dump();
    EXPECT_LT(s, 1.0) << n;
    const Answer c = Post(*cli, "/v1/completions", {{"prompt", Prompt()}, {"max_tokens", 2}});
    EXPECT_EQ(c.status, 200) << "after " << n << ": " << c.body.dump();
  }
  // Saving over the FIFO, the folder or a link is refused too (not replaced, not followed).
  for (const std::string n : {"fifo", "sub", "out"}) {
    const Answer a = Post(*cli, "/slots/0?action=save", {{"filename", n}});
    EXPECT_EQ(a.status, 400) << n << ": " << a.body.dump();
  }
  std::ifstream in(outside);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "not a slot");
}

}  // namespace
}  // namespace lockstep::test
