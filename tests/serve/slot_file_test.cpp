// Slot files (lockstep/engine/slot_file.h): a conversation's state written and read back bitwise,
// and every damaged, truncated, foreign or wrong-version file refused with the part named.
//
// The format tests build states by hand from a real engine's stage state after a prefill (K/V of
// every attention layer, GDN checkpoints, MTP K/V) plus made-up drafter and decoder state, for
// f32, bf16 and int8 K/V. The end-to-end tests (SlotFileConversation) run real conversations
// through the Scheduler: a live Continue against save -> fresh engine -> restore -> Continue.
#include "lockstep/engine/slot_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "lockstep/engine/digest.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/gdn_state.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/scheduler.h"
#include "serve/slot_file.h"
#include "test_util.h"

namespace lockstep {
namespace {

EngineConfig Config(DType kv, const std::string& preset = "tiny") {
  EngineConfig c;
  c.model = test::ModelDir(preset);
  c.threads = 2;
  c.prefill_chunk = 16;
  c.kv_page_rows = 8;
  c.kv_dtype = kv;
  return c;
}

EnginePtr MakeEngine(const EngineConfig& cfg, const std::string& preset = "tiny") {
  auto e = Engine::Create(cfg, test::Model(preset));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(*e);
}

// The engine's committed state after prefilling tokens[0, n-1), as a ConversationState.
ConversationState HandMade(Engine& e, const std::vector<std::int32_t>& tokens) {
  EXPECT_TRUE(e.Prefill(std::span(tokens).first(tokens.size() - 1)).ok());
  const ModelConfig& c = e.weights().config;
  ConversationState st;
  st.id = "conv-7";
  st.tokens = tokens;
  st.slot.position = e.position();
  for (int is = 0; is < e.n_stages(); ++is) {
    StageSlotSnapshot ss;
    ss.position = e.position();
    for (int il = 0; il < c.n_layers; ++il) {
      if (KvCache* kv = e.stage(is).kv(il)) ss.kv.emplace_back(il, kv->Prefix(e.position()));
      if (GdnState* g = e.stage(is).gdn(il))
        ss.gdn.emplace_back(il,
                            GdnCheckpoint{std::vector<float>(g->conv(), g->conv() + g->conv_size()),
                                          std::vector<float>(g->ssm(), g->ssm() + g->ssm_size())});
    }
    st.slot.stages.push_back(std::move(ss));
  }
  const int H = c.n_embd, V = c.n_vocab;
  if (e.has_mtp()) {
    // The MTP rows of all but the last two positions committed (random K/V), two pending.
    KvCache* mkv = e.stage(e.n_stages() - 1).mtp_kv();
    const int rows = e.position() - 2;
    const auto n = static_cast<std::size_t>(rows * c.n_heads_kv * c.head_dim);
    mkv->Write(0, rows, test::Random(n, 11).data(), test::Random(n, 12).data());
    mkv->Commit(rows);
    st.slot.stages.back().mtp_kv = mkv->Prefix(rows);
    st.slot.stages.back().mtp_rows = rows;
    st.has_mtp = true;
    st.mtp.pending_p = rows;
    st.mtp.next_row = rows + 2;
    st.mtp.pending_h = test::Random(static_cast<std::size_t>(2 * H), 13);
    st.mtp.pending_tokens = {tokens[4], tokens[5]};
    st.mtp.last_m = test::Random(static_cast<std::size_t>(H), 14);
    st.mtp.last_logits = test::Random(static_cast<std::size_t>(V), 15);
  }
  st.decoder.cur = tokens.back();
  st.decoder.streak = 2;
  st.decoder.windows = 9;
  st.decoder.policy_state = std::string("\x01\x00rates\xff", 8);
  st.options.max_new = 17;
  st.options.spec = 3;
  st.options.sampling.temperature = 0.7;
  st.options.sampling.top_p = 0.9;
  st.options.sampling.seed = 0xfedcba9876543210ull;
  st.options.draft_policy = "adaptive";
  st.options.inject = {"delay:stage=1,window=2,ms=5"};
  return st;
}

// Stored bytes of a prefix's rows (codes, then scales for int8).
std::string RawRows(const Engine& e, const KvPrefixPtr& p, int rows) {
  const ModelConfig& c = e.weights().config;
  KvCache kv(c.n_heads_kv, c.head_dim, e.config().kv_dtype, e.config().kv_page_rows);
  if (p) kv.AdoptPrefix(p);
  EXPECT_EQ(kv.rows_committed(), rows);
  std::string s;
  for (int r = 0; r < kv.rows_committed(); ++r) {
    s.append(reinterpret_cast<const char*>(kv.KRaw(r)), kv.row_bytes());
    s.append(reinterpret_cast<const char*>(kv.VRaw(r)), kv.row_bytes());
    if (kv.dtype() == DType::kI8) {
      s.append(reinterpret_cast<const char*>(kv.KScales(r)), sizeof(float) * kv.n_heads_kv());
      s.append(reinterpret_cast<const char*>(kv.VScales(r)), sizeof(float) * kv.n_heads_kv());
    }
  }
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every item of two states, bitwise.
void ExpectSameState(const Engine& e, const ConversationState& a, const ConversationState& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.slot.position, b.slot.position);
  ASSERT_EQ(a.slot.stages.size(), b.slot.stages.size());
  for (std::size_t is = 0; is < a.slot.stages.size(); ++is) {
    const StageSlotSnapshot &x = a.slot.stages[is], &y = b.slot.stages[is];
    EXPECT_EQ(x.position, y.position);
    ASSERT_EQ(x.kv.size(), y.kv.size());
    for (std::size_t i = 0; i < x.kv.size(); ++i) {
      EXPECT_EQ(x.kv[i].first, y.kv[i].first);
      EXPECT_EQ(RawRows(e, x.kv[i].second, x.position), RawRows(e, y.kv[i].second, y.position))
          << "stage " << is << " layer " << x.kv[i].first;
    }
    ASSERT_EQ(x.gdn.size(), y.gdn.size());
    for (std::size_t i = 0; i < x.gdn.size(); ++i) {
      EXPECT_EQ(x.gdn[i].first, y.gdn[i].first);
      EXPECT_TRUE(SameBits(x.gdn[i].second.conv, y.gdn[i].second.conv)) << x.gdn[i].first;
      EXPECT_TRUE(SameBits(x.gdn[i].second.ssm, y.gdn[i].second.ssm)) << x.gdn[i].first;
    }
    EXPECT_EQ(x.mtp_rows, y.mtp_rows);
    if (x.mtp_kv || y.mtp_kv) {
      EXPECT_EQ(RawRows(e, x.mtp_kv, x.mtp_rows), RawRows(e, y.mtp_kv, y.mtp_rows));
    }
  }
  EXPECT_EQ(a.has_mtp, b.has_mtp);
  EXPECT_EQ(a.mtp.next_row, b.mtp.next_row);
  EXPECT_EQ(a.mtp.pending_p, b.mtp.pending_p);
  EXPECT_TRUE(SameBits(a.mtp.pending_h, b.mtp.pending_h));
  EXPECT_EQ(a.mtp.pending_tokens, b.mtp.pending_tokens);
  EXPECT_TRUE(SameBits(a.mtp.last_m, b.mtp.last_m));
  EXPECT_TRUE(SameBits(a.mtp.last_logits, b.mtp.last_logits));
  EXPECT_EQ(a.decoder.cur, b.decoder.cur);
  EXPECT_EQ(a.decoder.streak, b.decoder.streak);
  EXPECT_EQ(a.decoder.windows, b.decoder.windows);
  EXPECT_EQ(a.decoder.policy_state, b.decoder.policy_state);
  const RequestOptions &o = a.options, &p = b.options;
  EXPECT_EQ(o.max_new, p.max_new);
  EXPECT_EQ(o.sampling.temperature, p.sampling.temperature);
  EXPECT_EQ(o.sampling.top_k, p.sampling.top_k);
  EXPECT_EQ(o.sampling.top_p, p.sampling.top_p);
  EXPECT_EQ(o.sampling.seed, p.sampling.seed);
  EXPECT_EQ(o.ignore_eos, p.ignore_eos);
  EXPECT_EQ(o.spec, p.spec);
  EXPECT_EQ(o.mtp, p.mtp);
  EXPECT_EQ(o.spec_max_suffix, p.spec_max_suffix);
  EXPECT_EQ(o.suffix_index, p.suffix_index);
  EXPECT_EQ(o.draft_policy, p.draft_policy);
  EXPECT_EQ(o.replay_path, p.replay_path);
  EXPECT_EQ(o.inject, p.inject);
}

std::string Encode(const Engine& e, const ConversationState& st) {
  auto bytes = EncodeConversation(e, st);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

// Replaces the trailing digest so that an edited file passes the digest check.
void Redigest(std::string& f) {
  f.resize(f.size() - slot_file::kDigestBytes);
  f += Sha256(f);
}

class SlotFileDtype : public ::testing::TestWithParam<DType> {};

TEST_P(SlotFileDtype, RoundTripIsBitwise) {
  EnginePtr e = MakeEngine(Config(GetParam()));
  const ConversationState st = HandMade(*e, test::Tokens(41, 3));
  const std::string path = test::NewDir("slot") + "/conv.slot";
  ASSERT_TRUE(SaveConversation(path, *e, st).ok());
  EnginePtr fresh = MakeEngine(Config(GetParam()));
  auto back = LoadConversation(path, *fresh);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameState(*e, st, *back);
  EXPECT_EQ(Encode(*fresh, *back), Encode(*e, st));  // and the file is a function of the state
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, SlotFileDtype,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kI8),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           return std::string(dtype_name(p.param));
                         });

class SlotFileDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    e_ = MakeEngine(Config(DType::kI8));
    st_ = HandMade(*e_, test::Tokens(41, 5));
    file_ = Encode(*e_, st_);
    auto table = slot_file::ReadSectionTable(file_);
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    sections_ = *table;
  }
  // Refused with an exit-2 code and a message naming `part`.
  void ExpectRefused(const std::string& bytes, const std::string& part, const std::string& why) {
    auto r = DecodeConversation(bytes, *e_);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().exit_code(), 2) << why << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(part), std::string::npos)
        << why << ": " << r.status().ToString();
  }
  EnginePtr e_;
  ConversationState st_;
  std::string file_;
  std::vector<slot_file::SectionEntry> sections_;
};

TEST_F(SlotFileDamage, TheTableListsEverySection) {
  const ModelConfig& c = e_->weights().config;
  const int n_attn = c.n_full_attention_layers();
  // tokens, 4 per int8 attention layer, 2 per GDN layer, 4 MTP K/V, 5 drafter, 2 decoder.
  EXPECT_EQ(sections_.size(),
            static_cast<std::size_t>(1 + 4 * n_attn + 2 * (c.n_layers - n_attn) + 4 + 5 + 2));
  EXPECT_EQ(sections_.front().name, "tokens");
  EXPECT_EQ(sections_.back().name, "decoder.policy");
  EXPECT_EQ(sections_.back().offset + sections_.back().bytes,
            file_.size() - slot_file::kDigestBytes);
}

TEST_F(SlotFileDamage, TruncatedAtTenPointsIsRefused) {
  const std::size_t n = file_.size();
  const std::size_t cuts[] = {
      0, 10, 20, 27, 28, 100, sections_[0].offset + 1, n / 2, n - slot_file::kDigestBytes, n - 1};
  for (std::size_t cut : cuts)
    ExpectRefused(file_.substr(0, cut), "slot file", std::to_string(cut));
  // A cut inside the sections names the section the file now ends in.
  const slot_file::SectionEntry& mid = sections_[sections_.size() / 2];
  ExpectRefused(file_.substr(0, mid.offset + mid.bytes / 2), "section '" + mid.name + "'",
                "cut in " + mid.name);
}

TEST_F(SlotFileDamage, OneFlippedByteInEverySectionIsRefusedAndNamed) {
  for (const slot_file::SectionEntry& s : sections_) {
    if (s.bytes == 0) continue;
    std::string bad = file_;
    bad[s.offset + s.bytes / 2] = static_cast<char>(bad[s.offset + s.bytes / 2] ^ 0x10);
    ExpectRefused(bad, "section '" + s.name + "'", s.name);
  }
  std::string bad = file_;
  bad[40] = static_cast<char>(bad[40] ^ 0x01);  // inside the header JSON
  ExpectRefused(bad, "digest mismatch", "header byte");
  bad = file_;
  bad[file_.size() - 3] = static_cast<char>(bad[file_.size() - 3] ^ 0x01);  // the digest itself
  ExpectRefused(bad, "digest", "digest byte");
}

// The digest is checked before the header is believed: a size made larger in the header (the
// JSON stays valid) is reported as a digest mismatch, not parsed.
TEST_F(SlotFileDamage, DigestIsCheckedBeforeTheHeader) {
  std::string bad = file_;
  const std::size_t at = bad.find("\"n_tokens\":41");
  ASSERT_NE(at, std::string::npos);
  bad[at + 11] = '9';  // 91 tokens
  ExpectRefused(bad, "digest", "n_tokens edited");
  // With the digest recomputed the same edit reaches the header checks, which refuse it.
  Redigest(bad);
  ExpectRefused(bad, "header.conversation", "n_tokens edited, re-digested");
}

TEST_F(SlotFileDamage, ReDigestedInconsistenciesAreRefused) {
  std::string bad = file_;
  const std::size_t at = bad.find("\"mtp_pending\":2");
  ASSERT_NE(at, std::string::npos);
  bad[at + 14] = '3';
  Redigest(bad);
  ExpectRefused(bad, "section 'mtp.pending_h'", "mtp_pending edited");
  // A token outside the vocabulary.
  bad = file_;
  const std::int32_t huge = 1 << 20;
  std::memcpy(bad.data() + sections_[0].offset, &huge, sizeof(huge));
  Redigest(bad);
  ExpectRefused(bad, "section 'tokens'", "token edited");
}

TEST_F(SlotFileDamage, WrongVersionAndMagicAreRefused) {
  std::string bad = file_;
  bad[16] = 2;
  ExpectRefused(bad, "slot file version", "version 2");
  EXPECT_EQ(DecodeConversation(bad, *e_).status().code(), Status::Code::kInvalidArgument);
  bad = file_;
  bad[0] = 'X';
  ExpectRefused(bad, "slot file magic", "magic");
}

TEST_F(SlotFileDamage, AnotherModelOrStateOptionIsRefused) {
  EnginePtr other = MakeEngine(Config(DType::kI8, "tiny-induction"), "tiny-induction");
  auto r = DecodeConversation(file_, *other);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("slot file model"), std::string::npos);
  EngineConfig cfg = Config(DType::kBF16);
  EnginePtr bf16 = MakeEngine(cfg);
  r = DecodeConversation(file_, *bf16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--kv"), std::string::npos) << r.status().ToString();
  cfg = Config(DType::kI8);
  cfg.prefill_chunk = 32;
  EnginePtr chunk = MakeEngine(cfg);
  r = DecodeConversation(file_, *chunk);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prefill_chunk"), std::string::npos);
  cfg = Config(DType::kI8);
  cfg.stages = 2;
  EnginePtr two = MakeEngine(cfg);
  r = DecodeConversation(file_, *two);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
}

TEST_F(SlotFileDamage, SizeBoundAndMissingFile) {
  const std::string path = test::NewDir("slot-bound") + "/conv.slot";
  ASSERT_TRUE(SaveConversation(path, *e_, st_).ok());
  auto r = LoadConversation(path, *e_, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2) << r.status().ToString();
  r = LoadConversation(path + ".missing", *e_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
}

// ---- end to end: a conversation through the scheduler ----

RequestOptions TurnOptions(int max_new) {
  RequestOptions o;
  o.max_new = max_new;
  o.spec = 3;
  o.mtp = true;
  o.spec_max_suffix = 6;
  o.draft_policy = "adaptive";  // its state has to travel too
  o.ignore_eos = true;
  return o;
}

struct Turn {
  RequestResult result;
  ConversationState state;  // exported after the turn
};

// Runs the scheduler until `t` ends; its result.
RequestResult RunUntilDone(Scheduler& s, Ticket t) {
  EXPECT_TRUE(s.RunUntilIdle().ok());
  for (RequestResult& r : s.TakeFinished())
    if (r.ticket == t) return std::move(r);
  ADD_FAILURE() << "ticket " << t << " did not finish";
  return {};
}

Turn FirstTurn(Scheduler& s, const std::vector<std::int32_t>& prompt) {
  RequestSpec spec;
  spec.id = "conv";
  spec.prompt = prompt;
  spec.options = TurnOptions(20);
  spec.keep = true;
  auto t = s.Submit(std::move(spec));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  Turn turn;
  turn.result = RunUntilDone(s, *t);
  EXPECT_TRUE(turn.result.status.ok()) << turn.result.status.ToString();
  EXPECT_TRUE(turn.result.kept);
  auto st = s.ExportConversation(*t);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (st.ok()) turn.state = std::move(*st);
  return turn;
}

Turn NextTurn(Scheduler& s, Ticket kept, const std::vector<std::int32_t>& more) {
  auto t = s.Continue(kept, more, TurnOptions(24));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  Turn turn;
  if (!t.ok()) return turn;
  turn.result = RunUntilDone(s, *t);
  EXPECT_TRUE(turn.result.status.ok()) << turn.result.status.ToString();
  auto st = s.ExportConversation(*t);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (st.ok()) turn.state = std::move(*st);
  return turn;
}

void ExpectSameTurn(const Engine& e, const Turn& a, const Turn& b) {
  EXPECT_EQ(a.result.result.output, b.result.result.output);
  const auto& wa = a.result.result.windows;
  const auto& wb = b.result.result.windows;
  ASSERT_EQ(wa.size(), wb.size());
  for (std::size_t i = 0; i < wa.size(); ++i)
    EXPECT_TRUE(wa[i].SamePath(wb[i])) << "window " << i << " (p " << wa[i].p << "): the path "
                                       << "differs (draft / accepted / source)";
  ConversationState sa = a.state, sb = b.state;
  sb.id = sa.id;  // the request ids are the callers' names
  ExpectSameState(e, sa, sb);
}

class SlotFileConversation : public ::testing::Test {
 protected:
  static EngineConfig Cfg() { return Config(DType::kBF16); }
  std::vector<std::int32_t> prompt_ = test::Tokens(40, 21);
  std::vector<std::int32_t> more_ = test::Tokens(9, 22);
};

TEST_F(SlotFileConversation, RestoredContinuesBitwiseLikeLive) {
  // Live: turn 1, then turn 2 in the same engine.
  EnginePtr live_e = MakeEngine(Cfg());
  Scheduler live(*live_e);
  Turn live1 = FirstTurn(live, prompt_);
  Turn live2 = NextTurn(live, live1.result.ticket, more_);
  ASSERT_GT(live2.result.result.windows.size(), 2u);

  // Saved after turn 1 on one engine, restored on a fresh one, continued there.
  EnginePtr save_e = MakeEngine(Cfg());
  Scheduler saver(*save_e);
  Turn saved1 = FirstTurn(saver, prompt_);
  ExpectSameTurn(*live_e, live1, saved1);
  const std::string path = test::NewDir("slot-e2e") + "/conv.slot";
  ASSERT_TRUE(SaveConversation(path, *save_e, saved1.state).ok());

  EnginePtr fresh = MakeEngine(Cfg());
  auto st = LoadConversation(path, *fresh);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectSameState(*fresh, saved1.state, *st);
  Scheduler restored(*fresh);
  auto t = restored.ImportConversation(*st);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Turn rest2 = NextTurn(restored, *t, more_);
  ExpectSameTurn(*fresh, live2, rest2);
}

// The request's penalties travel in the header (issue 42); a request without them writes the
// header earlier builds wrote (no "penalties" key), so their files and digests stay as they were.
TEST_F(SlotFileConversation, PenaltiesTravelAndOnlyWhenSet) {
  EnginePtr e = MakeEngine(Cfg());
  Scheduler s(*e);
  Turn turn = FirstTurn(s, prompt_);
  const std::string dir = test::NewDir("slot-penalties");
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  ASSERT_TRUE(SaveConversation(dir + "/plain.slot", *e, turn.state).ok());
  EXPECT_EQ(bytes(dir + "/plain.slot").find("penalties"), std::string::npos);
  ConversationState st = turn.state;
  st.options.sampling.presence_penalty = 0.5;
  st.options.sampling.frequency_penalty = -0.25;
  st.options.sampling.repeat_penalty = 1.5;
  st.options.sampling.repeat_last_n = -1;
  ASSERT_TRUE(SaveConversation(dir + "/pen.slot", *e, st).ok());
  EXPECT_NE(bytes(dir + "/pen.slot").find("penalties"), std::string::npos);
  EnginePtr fresh = MakeEngine(Cfg());
  auto back = LoadConversation(dir + "/pen.slot", *fresh);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->options.sampling.presence_penalty, 0.5);
  EXPECT_EQ(back->options.sampling.frequency_penalty, -0.25);
  EXPECT_EQ(back->options.sampling.repeat_penalty, 1.5);
  EXPECT_EQ(back->options.sampling.repeat_last_n, -1);
  auto plain = LoadConversation(dir + "/plain.slot", *fresh);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->options.sampling.penalized());
}

// A probe request on `e` (a fresh scheduler over its free slots): its tokens, path and state,
// exported before its slot is released.
Turn Probe(Engine& e) {
  Scheduler s(e);
  Turn turn = FirstTurn(s, test::Tokens(23, 31));
  EXPECT_TRUE(s.Release(turn.result.ticket).ok());
  return turn;
}

TEST_F(SlotFileConversation, RefusedFilesLeaveTheEngineAsItWas) {
  EnginePtr save_e = MakeEngine(Cfg());
  Scheduler saver(*save_e);
  const std::string good = Encode(*save_e, FirstTurn(saver, prompt_).state);
  auto table = slot_file::ReadSectionTable(good);
  ASSERT_TRUE(table.ok());

  std::vector<std::pair<std::string, std::string>> bad;  // (what, bytes)
  for (std::size_t i = 1; i <= 10; ++i)
    bad.emplace_back("cut", good.substr(0, good.size() * i / 11));
  for (const slot_file::SectionEntry& s : *table) {
    if (s.bytes == 0) continue;
    std::string b = good;
    b[s.offset + s.bytes - 1] = static_cast<char>(b[s.offset + s.bytes - 1] ^ 0x40);
    bad.emplace_back(s.name, b);
  }
  std::string v2 = good;
  v2[16] = 2;
  bad.emplace_back("version", v2);

  EnginePtr e = MakeEngine(Cfg());
  const Turn before = Probe(*e);
  std::vector<bool> open_before;
  for (int s = 0; s < e->max_slots(); ++s) open_before.push_back(e->slot_open(s));
  for (const auto& [what, bytes] : bad) {
    auto r = DecodeConversation(bytes, *e);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().exit_code(), 2) << what << ": " << r.status().ToString();
    if (what != "cut" && what != "version") {
      EXPECT_NE(r.status().message().find("'" + what + "'"), std::string::npos)
          << r.status().ToString();
    }
    for (int s = 0; s < e->max_slots(); ++s)
      EXPECT_EQ(e->slot_open(s), open_before[static_cast<std::size_t>(s)]) << what;
  }
  // Another model: refused as well.
  EnginePtr other = MakeEngine(Config(DType::kBF16, "tiny-induction"), "tiny-induction");
  EXPECT_EQ(DecodeConversation(good, *other).status().code(), Status::Code::kInvalidArgument);
  // The engine computes exactly what it computed before the refusals.
  ExpectSameTurn(*e, before, Probe(*e));

  // A sound file and no free slot: refused before the engine is touched; the imported
  // conversation, once released, leaves a slot that computes the probe as before.
  auto st = DecodeConversation(good, *e);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  {
    Scheduler s(*e);
    auto held = s.ImportConversation(*st);
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    auto second = s.ImportConversation(*st);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), Status::Code::kRuntime) << second.status().ToString();
    EXPECT_TRUE(e->slot_open(0));
    EXPECT_TRUE(s.Release(*held).ok());
  }
  ExpectSameTurn(*e, before, Probe(*e));
}

}  // namespace
}  // namespace lockstep
