// Speculative decoding (issue "Speculative decoding", Must show 1-6): greedy and sampled outputs
// equal plain decoding for every policy / drafter / index mode; committed state after every
// commit equals plain decoding's; rejected drafts never touch committed state; the latency
// policy's path reacts to an injected delay while the adaptive policy's never does; a recorded
// path replays exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include "decode/draft_policy.h"
#include "decode/suffix_index.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/tokenizer.h"
#include "lockstep/instrument/fingerprint.h"
#include "test_util.h"

namespace lockstep {
namespace {

std::vector<std::int32_t> Repetitive() {
  return EncodeBytes(std::string(20, ' ') + std::string(300, 'a') +
                     "abcabcabc abcabcabc abcabcabc");
}
std::vector<std::int32_t> Varied() {
  return EncodeBytes(
      "Speculative decoding needs a drafter that is often right; this prompt is not repetitive.");
}

EngineConfig Config(const std::string& preset) {
  EngineConfig c;
  c.model = test::ModelDir(preset);
  c.threads = 2;
  c.max_new = preset == "tiny" ? 64 : 24;
  c.ignore_eos = true;
  c.prefill_chunk = 64;
  return c;
}

GenerateResult RunGen(const EngineConfig& c, const std::vector<std::int32_t>& prompt,
                      const std::string& preset, const GenerateHooks* hooks = nullptr) {
  auto e = Engine::Create(c, test::Model(preset));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  auto r = Generate(**e, prompt, hooks);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : GenerateResult{};
}

// Digest of the committed state of every stage: committed K/V rows of every attention layer and
// the GDN checkpoints.
std::string StateDigest(Engine& e) {
  std::string bytes;
  for (int is = 0; is < e.n_stages(); ++is) {
    StageSession& s = e.stage(is);
    for (int il = s.layer_begin(); il < s.layer_end(); ++il) {
      if (KvCache* kv = s.kv(il)) {
        for (int r = 0; r < kv->rows_committed(); ++r) {
          bytes.append(reinterpret_cast<const char*>(kv->KRaw(r)), kv->row_bytes());
          bytes.append(reinterpret_cast<const char*>(kv->VRaw(r)), kv->row_bytes());
        }
      }
      if (GdnState* g = s.gdn(il)) {
        bytes.append(reinterpret_cast<const char*>(g->conv()), g->conv_size() * sizeof(float));
        bytes.append(reinterpret_cast<const char*>(g->ssm()), g->ssm_size() * sizeof(float));
        bytes += std::to_string(g->position());
      }
    }
  }
  return Sha256Hex(bytes);
}

EnginePtr MakeEngine(const EngineConfig& c, const ModelWeights& w) {
  auto r = Engine::Create(c, w);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

struct Variant {
  std::string policy, index;
  bool mtp;
};
std::vector<Variant> AllVariants() {
  std::vector<Variant> v;
  for (const char* p : {"static", "adaptive", "latency"})
    for (const char* ix : {"sync", "async"})
      for (bool m : {true, false}) v.push_back({p, ix, m});
  return v;
}

// ---- Must show 1: greedy speculative == greedy plain ----
TEST(Speculative, GreedyOutputEqualsPlainDecoding) {
  for (const std::string preset : {"tiny", "small"}) {
    for (const auto& prompt : {Repetitive(), Varied()}) {
      EngineConfig plain = Config(preset);
      const auto ref = RunGen(plain, prompt, preset).output;
      ASSERT_EQ(static_cast<int>(ref.size()), plain.max_new);
      int drafted = 0, accepted = 0;
      for (const auto& v : AllVariants()) {
        // small: every policy with MTP on and off; async indexing with the static policy.
        if (preset == "small" && v.index == "async" && v.policy != "static") continue;
        EngineConfig c = plain;
        c.spec = 4;
        c.draft_policy = v.policy;
        c.suffix_index = v.index;
        c.mtp = v.mtp;
        auto r = RunGen(c, prompt, preset);
        EXPECT_EQ(r.output, ref) << preset << " " << v.policy << " " << v.index << " mtp=" << v.mtp;
        for (const auto& w : r.windows) drafted += w.T - 1, accepted += w.accepted;
      }
      EXPECT_GT(drafted, 0) << preset << ": nothing was drafted, the comparison proves nothing";
      EXPECT_GT(accepted, 0) << preset << ": no draft was ever accepted";
    }
  }
}

// ---- Must show 4: seeded sampling, same tokens with and without speculation ----
TEST(Speculative, SampledOutputEqualsPlainSampling) {
  EngineConfig plain = Config("tiny");
  plain.temperature = 0.9;
  plain.top_p = 0.95;
  plain.seed = 20261018;
  const auto prompt = Varied();
  const auto ref = RunGen(plain, prompt, "tiny").output;
  EngineConfig other_seed = plain;
  other_seed.seed = 1;
  EXPECT_NE(RunGen(other_seed, prompt, "tiny").output, ref) << "the seed must matter";
  int accepted = 0;
  for (const auto& v : AllVariants()) {
    EngineConfig c = plain;
    c.spec = 3;
    c.draft_policy = v.policy;
    c.suffix_index = v.index;
    c.mtp = v.mtp;
    auto r = RunGen(c, prompt, "tiny");
    EXPECT_EQ(r.output, ref) << v.policy << " " << v.index << " mtp=" << v.mtp;
    for (const auto& w : r.windows) accepted += w.accepted;
  }
  EXPECT_GT(accepted, 0);
}

// Penalties (issue 42) read the request's history, and a verify window's row i must see the
// tokens accepted before it in the same window: greedy and sampled, penalised speculative ==
// penalised plain, on the repetitive prompt where drafts are accepted and penalties bite.
TEST(Speculative, PenalisedOutputEqualsPlainDecoding) {
  for (double temperature : {0.0, 0.9}) {
    EngineConfig plain = Config("tiny");
    plain.temperature = temperature;
    plain.seed = 7;
    const auto prompt = Repetitive();
    const auto unpenalised = RunGen(plain, prompt, "tiny").output;
    plain.presence_penalty = 0.5;
    plain.frequency_penalty = 0.75;
    plain.repeat_penalty = 1.3;
    plain.repeat_last_n = 32;
    const auto ref = RunGen(plain, prompt, "tiny").output;
    EXPECT_NE(ref, unpenalised) << "T=" << temperature << ": the penalties changed nothing";
    int accepted = 0;
    for (bool mtp : {true, false}) {
      EngineConfig c = plain;
      c.spec = 4;
      c.mtp = mtp;
      auto r = RunGen(c, prompt, "tiny");
      EXPECT_EQ(r.output, ref) << "T=" << temperature << " mtp=" << mtp;
      for (const auto& w : r.windows) accepted += w.accepted;
    }
    EXPECT_GT(accepted, 0) << "T=" << temperature << ": no draft accepted, nothing proven";
  }
}

// The in-window half of that history, where it bites: the induction model copies "abc" with
// suffix drafts accepted several to a window, and a small frequency penalty decides at which step
// the copied token's growing count flips the argmax. A row that did not count the tokens accepted
// before it in its own window flips later than plain decoding does (planted: `.more = {}` in
// Sequence::AcceptAndCommit; this test fails, the one above does not).
TEST(Speculative, PenaltiesCountTheTokensAcceptedEarlierInTheWindow) {
  const std::string preset = "tiny-induction";
  std::string text;
  for (int i = 0; i < 8; ++i) text += "abc";
  const auto prompt = EncodeBytes(text);
  EngineConfig plain = Config("tiny");
  plain.model = test::ModelDir(preset);
  const auto unpenalised = RunGen(plain, prompt, preset).output;
  plain.frequency_penalty = 0.2;
  const auto ref = RunGen(plain, prompt, preset).output;
  EXPECT_NE(ref, unpenalised) << "the penalty changed nothing";
  for (bool mtp : {true, false}) {
    EngineConfig c = plain;
    c.spec = 4;
    c.mtp = mtp;
    const auto r = RunGen(c, prompt, preset);
    EXPECT_EQ(r.output, ref) << "mtp=" << mtp;
    int multi = 0;  // windows where a row had accepted tokens before it
    for (const auto& w : r.windows) multi += w.accepted >= 1;
    EXPECT_GT(multi, 0) << "mtp=" << mtp << ": no window accepted a draft, nothing proven";
  }
}

// ---- Must show 2: after every commit, committed state == plain decoding at that position ----
TEST(Speculative, CommittedStateEqualsPlainAfterEveryCommit) {
  const auto prompt = Varied();
  EngineConfig plain = Config("tiny");
  plain.max_new = 40;
  std::map<int, std::string> ref;  // committed position -> digest
  {
    auto e = MakeEngine(plain, test::Model("tiny"));
    GenerateHooks h;
    h.on_record = [&](const WindowRecord&) {
      ref[e->position()] = StateDigest(*e);
      return Status::Ok();
    };
    ASSERT_TRUE(Generate(*e, prompt, &h).ok());
  }
  ASSERT_EQ(ref.size(), 40u);
  for (const char* policy : {"static", "adaptive"}) {
    EngineConfig c = plain;
    c.spec = 4;
    c.draft_policy = policy;
    auto e = MakeEngine(c, test::Model("tiny"));
    GenerateHooks h;
    int checked = 0, multi = 0;
    h.on_record = [&](const WindowRecord& rec) {
      auto it = ref.find(e->position());
      EXPECT_NE(it, ref.end());
      if (it != ref.end()) {
        EXPECT_EQ(StateDigest(*e), it->second)
            << policy << " window " << rec.idx << " at p=" << e->position();
        ++checked;
        multi += rec.accepted > 0;
      }
      return Status::Ok();
    };
    auto r = Generate(*e, prompt, &h);
    ASSERT_TRUE(r.ok());
    EXPECT_GT(checked, 0);
    if (std::string(policy) == "static") {
      EXPECT_GT(multi, 0) << "no window accepted a draft";
    }
  }
}

// ---- Must show 3: rejecting everything leaves the caches as if only the bonus row ran ----
TEST(Speculative, RejectedDraftsNeverTouchCommittedState) {
  const auto& w = test::Model("tiny");
  const auto prompt = Varied();
  EngineConfig c = Config("tiny");
  auto spec = MakeEngine(c, w);
  auto plain = MakeEngine(c, w);
  std::span<const std::int32_t> pre(prompt.data(), prompt.size() - 1);
  ASSERT_TRUE(spec->Prefill(pre).ok());
  ASSERT_TRUE(plain->Prefill(pre).ok());
  const std::string before = StateDigest(*spec);
  const std::size_t V = static_cast<std::size_t>(w.config.n_vocab);
  std::vector<float> l1(V), l5(5 * V);
  std::int32_t cur = prompt.back();
  ASSERT_TRUE(plain->Verify(std::span<const std::int32_t>(&cur, 1), l1.data()).ok());
  const std::int32_t y = Argmax(l1.data(), static_cast<int>(V));
  // Four drafts that are all wrong: the first differs from the target's token.
  std::vector<std::int32_t> window{cur, (y + 1) % 512, 7, 8, 9};
  ASSERT_TRUE(spec->Verify(window, l5.data()).ok());
  EXPECT_EQ(StateDigest(*spec), before) << "verify alone must not change committed state";
  EXPECT_EQ(Argmax(l5.data(), static_cast<int>(V)), y);
  ASSERT_TRUE(spec->Commit(1).ok());
  ASSERT_TRUE(plain->Commit(1).ok());
  EXPECT_EQ(StateDigest(*spec), StateDigest(*plain)) << "only the bonus row may be committed";
  EXPECT_NE(StateDigest(*spec), before);
  const int attn = w.config.n_layers - 1;
  EXPECT_EQ(spec->stage(spec->n_stages() - 1).kv(attn)->rows_committed(),
            static_cast<int>(prompt.size()));
}

// ---- Must show 5: latency policy + injected delay changes the path, not the output ----
TEST(Speculative, LatencyPolicyReactsToInjectedDelayAdaptiveNever) {
  const auto prompt = Varied();
  EngineConfig base = Config("tiny");
  base.spec = 4;
  base.max_new = 96;
  base.draft_policy = "adaptive";
  const auto adaptive_ref = RunGen(base, prompt, "tiny");
  // Pick a delayed window after which the adaptive choice drafts within the back-off span.
  int W = -1;
  for (int i = 4; i + 8 < static_cast<int>(adaptive_ref.windows.size()) && W < 0; ++i)
    for (int j = i + 1; j <= i + 4; ++j)
      if (adaptive_ref.windows[static_cast<std::size_t>(j)].T > 1) {
        W = i;
        break;
      }
  ASSERT_GE(W, 0) << "adaptive never drafts on this prompt";
  const std::string delay = "delay:stage=1:window=" + std::to_string(W) + ":ms=300";

  EngineConfig adaptive_delayed = base;
  adaptive_delayed.inject = {delay};
  const auto ad = RunGen(adaptive_delayed, prompt, "tiny");
  EXPECT_EQ(ad.output, adaptive_ref.output);
  ASSERT_EQ(ad.windows.size(), adaptive_ref.windows.size());
  for (std::size_t i = 0; i < ad.windows.size(); ++i)
    EXPECT_TRUE(ad.windows[i].SamePath(adaptive_ref.windows[i]))
        << "adaptive path changed at window " << i;
  EXPECT_GE(ad.windows[static_cast<std::size_t>(W)].verify_ns, 300'000'000)
      << "the delay was injected";

  EngineConfig latency = base;
  latency.draft_policy = "latency";
  const auto lat_ref = RunGen(latency, prompt, "tiny");
  latency.inject = {delay};
  const auto lat = RunGen(latency, prompt, "tiny");
  EXPECT_EQ(lat.output, lat_ref.output) << "the output never depends on the path";
  EXPECT_EQ(lat.output, adaptive_ref.output);
  for (int i = 0; i <= W; ++i)
    EXPECT_TRUE(lat.windows[static_cast<std::size_t>(i)].SamePath(
        lat_ref.windows[static_cast<std::size_t>(i)]))
        << "before the delay the paths agree (window " << i << ")";
  int first_diff = -1;
  for (std::size_t i = 0;
       i < std::min(lat.windows.size(), lat_ref.windows.size()) && first_diff < 0; ++i)
    if (!lat.windows[i].SamePath(lat_ref.windows[i])) first_diff = static_cast<int>(i);
  EXPECT_GT(first_diff, W) << "the path changes after the delayed window";
  EXPECT_LE(first_diff, W + 5);
}

// ---- Must show 6: --replay-path reproduces a recorded path exactly ----
TEST(Speculative, ReplayReproducesRecordedPath) {
  const auto prompt = Repetitive();
  EngineConfig a = Config("tiny");
  a.spec = 4;
  a.draft_policy = "static";
  a.suffix_index = "async";  // the recorded path is timing-dependent
  a.max_new = 80;
  const auto ra = RunGen(a, prompt, "tiny");
  std::string path = test::NewDir("replay") + "/a.jsonl";
  {
    std::ofstream f(path);
    for (const auto& w : ra.windows) f << w.ToJsonLine() << "\n";
  }
  for (const char* policy : {"static", "adaptive"}) {
    EngineConfig b = a;
    b.draft_policy = policy;
    b.suffix_index = "sync";
    b.replay_path = path;
    const auto rb = RunGen(b, prompt, "tiny");
    EXPECT_EQ(rb.output, ra.output);
    ASSERT_EQ(rb.windows.size(), ra.windows.size());
    for (std::size_t i = 0; i < ra.windows.size(); ++i)
      EXPECT_TRUE(rb.windows[i].SamePath(ra.windows[i])) << policy << " window " << i;
  }
  // A path recorded on another model is inconsistent with this model's output: a clear error.
  EngineConfig other = a;
  auto tampered = ra.windows;
  bool changed = false;
  for (auto& w : tampered)
    if (w.accepted > 0 && !changed) {
      w.draft[0] = (w.draft[0] + 1) % 512;  // the model will reject what it accepted before
      changed = true;
    }
  ASSERT_TRUE(changed) << "run A accepted no draft";
  std::string bad = test::NewDir("replay-bad") + "/b.jsonl";
  {
    std::ofstream f(bad);
    for (const auto& w : tampered) f << w.ToJsonLine() << "\n";
  }
  other.replay_path = bad;
  auto e2 = MakeEngine(other, test::Model("tiny"));
  auto r = Generate(*e2, prompt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("inconsistent"), std::string::npos) << r.status().message();
}

// With induction heads the model continues repeated text, so suffix drafts are accepted in long
// runs: the machinery the seed issue's from_sfx windows come from.
TEST(Speculative, SuffixDraftsAcceptedOnRepetitiveInput) {
  const std::string preset = "small-induction";
  std::vector<std::int32_t> block, prompt;
  for (std::uint64_t i = 0; i < 48; ++i)
    block.push_back(static_cast<std::int32_t>(300 + (i * 2654435761ull) % 3700));
  for (int r = 0; r < 6; ++r) prompt.insert(prompt.end(), block.begin(), block.end());
  EngineConfig plain = Config(preset);
  plain.max_new = 48;
  const auto ref = RunGen(plain, prompt, preset).output;
  // A random model emits a block token with probability 48/4096; the induction model continues
  // the block. Membership is counted, and (stricter) the tokens in place: token i of the output
  // is block[i] (measured 48 of 48 for both since the copying circuit's copies stopped feeding
  // the later induction heads; 38 of 48 by membership before).
  int in_block = 0, in_place = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    in_block += std::find(block.begin(), block.end(), ref[i]) != block.end();
    in_place += ref[i] == block[i % block.size()];
  }
  RecordProperty("in_block", std::to_string(in_block));
  RecordProperty("in_place", std::to_string(in_place));
  EXPECT_GE(in_block, 24) << "the induction model should continue the repeated block";
  EXPECT_GE(in_place, 40) << "the induction model should continue the repeated block in order";
  EngineConfig c = plain;
  c.spec = 4;
  c.mtp = false;
  const auto r = RunGen(c, prompt, preset);
  EXPECT_EQ(r.output, ref);
  const double per_window =
      static_cast<double>(r.output.size()) / static_cast<double>(r.windows.size());
  RecordProperty("tokens_per_window", std::to_string(per_window));
  EXPECT_GE(per_window,
            4.0);  // measured 6.9 (small, seed 7, 48 tokens; 2.4 before the copying fix)
  int from_sfx = 0;
  for (const auto& w : r.windows) from_sfx += w.from_sfx && w.accepted > 0;
  EXPECT_GT(from_sfx, 0);
}

TEST(Speculative, WindowRecordsAreWellFormed) {
  EngineConfig c = Config("tiny");
  c.spec = 4;
  c.spec_max_suffix = 8;
  const auto r = RunGen(c, Repetitive(), "tiny");
  ASSERT_FALSE(r.windows.empty());
  EXPECT_EQ(r.windows[0].T, 1) << "the first window never drafts";
  EXPECT_EQ(r.windows[0].p, static_cast<int>(Repetitive().size()) - 1);
  int p = r.windows[0].p, total = 0, streak = 0;
  for (const auto& w : r.windows) {
    EXPECT_EQ(w.p, p);
    EXPECT_EQ(w.T, 1 + static_cast<int>(w.draft.size()));
    EXPECT_LE(w.T_mtp, w.T - 1);
    EXPECT_EQ(w.merged, w.source == DraftSource::kMerged);
    EXPECT_EQ(w.from_sfx, w.source == DraftSource::kSuffix || w.source == DraftSource::kMerged);
    EXPECT_LE(w.T, 1 + std::max(c.spec, c.spec_max_suffix));
    EXPECT_EQ(w.chain_n, streak);
    EXPECT_GE(w.verify_ns, w.compute_ns / 2);
    EXPECT_EQ(w.stages.size(), 4u);
    for (std::size_t s = 1; s < w.stages.size(); ++s)
      EXPECT_GE(w.stages[s].wait_ns, w.stages[s - 1].wait_ns);
    auto back = WindowRecord::FromJsonLine(w.ToJsonLine(), "rt");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(back->SamePath(w));
    streak = w.T > 1 && w.accepted == w.T - 1 ? streak + 1 : 0;
    p += w.accepted + 1;
    total += w.accepted + 1;
  }
  EXPECT_EQ(total, c.max_new);
}

// A proposal that runs into the current end continues its period up to the draft budget: what
// Propose would return after the proposed tokens were appended.
TEST(Speculative, PeriodicProposalExtendsToTheDraftBudget) {
  SuffixAutomaton sam;
  for (std::int32_t t : {7, 8, 9, 1, 2, 1, 2, 1, 2}) sam.Append(t);
  SuffixProposal p = sam.Propose(8, 3);
  ASSERT_EQ(p.tokens, (std::vector<std::int32_t>{1, 2}));  // stops at the current end
  EXPECT_EQ(p.period, 2);
  ExtendPeriodic(p, 8);
  EXPECT_EQ(p.tokens, (std::vector<std::int32_t>{1, 2, 1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(p.match_len, 4);  // the match itself is unchanged
  // A proposal that stopped before the end (max_len reached) or matched nothing is left alone.
  SuffixAutomaton long_period;
  for (std::int32_t t : {1, 2, 3, 4, 5, 6, 1, 2, 3}) long_period.Append(t);
  SuffixProposal q = long_period.Propose(2, 3);
  ASSERT_EQ(q.tokens, (std::vector<std::int32_t>{4, 5}));
  EXPECT_EQ(q.period, 6);
  ExtendPeriodic(q, 8);
  EXPECT_EQ(q.tokens, (std::vector<std::int32_t>{4, 5}));
  SuffixProposal none;
  ExtendPeriodic(none, 8);
  EXPECT_TRUE(none.tokens.empty());
}

// With a short loop (period 2) in the output, suffix drafts fill the whole budget instead of
// one period per window, and speculative output still equals plain output.
TEST(Speculative, ShortLoopsDraftTheWholeBudget) {
  const std::vector<std::int32_t> prompt =
      EncodeBytes(std::string(40, ' ') + "xyxyxyxyxyxyxyxyxyxyxyxyxyxyxy");
  EngineConfig c = Config("tiny");
  c.spec = 4;
  c.spec_max_suffix = 8;
  c.mtp = false;
  const auto plain_out = RunGen(
                             [&] {
                               EngineConfig p = c;
                               p.spec = 0;
                               return p;
                             }(),
                             prompt, "tiny")
                             .output;
  const auto r = RunGen(c, prompt, "tiny");
  EXPECT_EQ(r.output, plain_out);
  int longest = 0;
  for (const auto& w : r.windows) longest = std::max(longest, w.T - 1);
  RecordProperty("longest_draft", std::to_string(longest));
  EXPECT_EQ(longest, c.spec_max_suffix)
      << "a period-2 loop proposes only 2 tokens without the periodic extension";
}

// Adaptive suffix drafting keeps one acceptance rate per match-length class: misses of short
// natural-text matches do not shorten drafts from a long repeated block, which draft the whole
// budget from their first window; misses of long matches do shorten them.
TEST(Speculative, AdaptiveLongMatchesDraftTheBudgetDespiteShortMatchMisses) {
  auto proposal = [](int match_len) {
    SuffixProposal p;
    p.tokens.assign(8, 5);
    p.match_len = match_len;
    p.occurrences = 1;
    p.period = 100;
    return p;
  };
  auto window = [](int T, int accepted) {
    WindowRecord r;
    r.T = T;
    r.accepted = accepted;
    r.source = DraftSource::kSuffix;
    return r;
  };
  {
    auto policy = DraftPolicy::Create("adaptive");
    const DraftPlan first = policy->Plan(proposal(200), false, 4, 8);
    EXPECT_EQ(first.source, DraftSource::kSuffix);
    EXPECT_EQ(first.n_sfx, 8) << "a long match drafts the budget from its first window";
  }
  auto policy = DraftPolicy::Create("adaptive");
  for (int i = 0; i < 6; ++i) {  // short matches that keep missing
    const DraftPlan plan = policy->Plan(proposal(4), false, 4, 8);
    policy->Observe(window(1 + plan.n_sfx, 0));
  }
  EXPECT_EQ(policy->Plan(proposal(4), false, 4, 8).n_sfx, 0) << "short matches stop drafting";
  policy->Observe(window(1, 0));
  EXPECT_EQ(policy->Plan(proposal(200), false, 4, 8).n_sfx, 8) << "long matches are not affected";
  policy->Observe(window(1 + 8, 0));  // ... until they miss themselves
  policy->Observe(window(1, 0));
  EXPECT_LT(policy->Plan(proposal(200), false, 4, 8).n_sfx, 8);
}

}  // namespace
}  // namespace lockstep
