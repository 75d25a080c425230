// The static part of `lockstep preflight`: which knobs of a config make results timing- or
// batch-dependent, and which properties the config claims. Every statement here is one the
// engine documents (docs/engine.md) or the probes measured (harness/README.md, "Preflight");
// knobs that only change results deterministically (kv dtype, expert residency, sampling with a
// seed) are not listed.
#include <cstdio>

#include "lockstep/harness/preflight.h"

namespace lockstep {

namespace {

struct PropertyName {
  PreflightProperty p;
  const char* id;
  const char* title;
};
constexpr PropertyName kProperties[] = {
    {PreflightProperty::kFreshRepeat, "fresh_repeat",
     "the same request twice on fresh engines, the second with a stall"},
    {PreflightProperty::kIndexTiming, "index_timing",
     "drafts do not depend on when the suffix index catches up"},
    {PreflightProperty::kLoad, "load", "a request alone == the same request under load"},
    {PreflightProperty::kColdWarm, "cold_warm", "cold == warm (prefix cache)"},
    {PreflightProperty::kVerifySingle, "verify_single",
     "a verify window == the same tokens one by one"},
    {PreflightProperty::kThreads, "threads", "1 thread == 2 threads"},
    {PreflightProperty::kEngineAge, "engine_age",
     "request 1 on a fresh engine == the same request as request k"},
};

bool Speculative(const EngineConfig& c) { return c.spec > 0 || !c.replay_path.empty(); }
// Drafts come from the policy and the index (not replayed).
bool PolicyDrafts(const EngineConfig& c) { return c.spec > 0 && c.replay_path.empty(); }
bool SuffixDrafts(const EngineConfig& c) { return PolicyDrafts(c) && c.spec_max_suffix > 0; }

void AddTiming(const EngineConfig& c, std::vector<KnobFinding>& out) {
  if (c.draft_policy == "latency") {
    KnobFinding k{"draft_policy",
                  "latency",
                  PolicyDrafts(c),
                  "a verify slower than max(3 x its running mean, mean + 50 ms) pauses drafting "
                  "for 4 windows: T and the drafts follow measured time",
                  PreflightProperty::kFreshRepeat,
                  ""};
    if (c.spec == 0) k.note = "inactive: spec 0 drafts nothing";
    if (!c.replay_path.empty()) k.note = "inactive: drafts are replayed from replay_path";
    out.push_back(k);
  }
  if (c.suffix_index == "async") {
    KnobFinding k{"suffix_index",
                  "async",
                  SuffixDrafts(c),
                  "the index is updated on a background thread and a draft reads what it holds "
                  "at draft time: suffix drafts (T, from_sfx) depend on when it catches up",
                  PreflightProperty::kIndexTiming,
                  ""};
    if (!SuffixDrafts(c))
      k.note = c.spec == 0             ? "inactive: spec 0 drafts nothing"
               : c.replay_path.empty() ? "inactive: spec_max_suffix 0 (no suffix drafts)"
                                       : "inactive: drafts are replayed from replay_path";
    out.push_back(k);
  }
  if (!c.replay_path.empty())
    out.push_back({"replay_path", c.replay_path, true,
                   "every window takes the recorded drafts: the path is pinned, whatever the "
                   "policy, the index or the timing",
                   std::nullopt, ""});
}

void AddBackend(const EngineConfig& c, int hw, std::vector<KnobFinding>& out) {
  if (!c.deterministic) {
    KnobFinding k{"deterministic",
                  "off",
                  c.backend == "cuda",
                  "cuda: verify windows use cuBLAS GEMMs (TF32, shape-dependent algorithms) and "
                  "the MoE combine runs in any order: bits vary run to run and with T",
                  PreflightProperty::kFreshRepeat,
                  ""};
    if (c.backend != "cuda") k.note = "inactive: the cpu backend is always deterministic";
    out.push_back(k);
  }
  if (c.backend == "cuda")
    out.push_back({"cuda_attn_split", std::to_string(c.cuda_attn_split), true,
                   "attention rows with a longer context run in blocks of this size: their bits "
                   "depend on the value, so both arms of an A/A must share it",
                   std::nullopt, ""});
  const int n = c.threads > 0 ? c.threads : hw;
  KnobFinding t{
      "threads",
      c.threads > 0 ? std::to_string(c.threads) : "0 (auto: " + std::to_string(hw) + " here)",
      c.prefill_chunk > 1,
      "prefill products (Eigen GEMM) split their output rows over the threads and "
      "Eigen's blocking follows each range's shape, so prefill state differs in "
      "rounding between thread counts (decode and verify rows do not)",
      PreflightProperty::kThreads,
      ""};
  if (c.prefill_chunk == 1) {
    t.note = "inactive: prefill_chunk 1 runs prefill rows one at a time";
  } else if (c.threads == 0) {
    t.note = "auto: the count is the machine's (" + std::to_string(n) +
             " here); the same config on another core count gives other prefill bits";
  }
  if (c.backend != "cpu") t.note += (t.note.empty() ? "" : "; ") + std::string("measured on cpu");
  out.push_back(t);
}

void AddService(const EngineConfig& c, std::vector<KnobFinding>& out) {
  if (!c.batch_invariant) {
    KnobFinding k{"batch_invariant",
                  "off",
                  c.slots > 1,
                  "every product of a multi-request step runs as one GEMM over all its rows: a "
                  "request's bits depend on what shares its steps (arrivals, batch_tokens)",
                  PreflightProperty::kLoad,
                  ""};
    if (c.slots <= 1)
      k.note = "inactive: slots 1 (no request shares a step; lockstep serve defaults to 16)";
    out.push_back(k);
  }
  if (c.prefix_cache) {
    out.push_back(
        {"prefix_cache", "on (snapshot grid " + std::to_string(c.SnapshotGrid()) + ")", true,
         "warm prompts resume from GDN snapshots on the grid (a multiple of prefill_chunk, so a "
         "warm prefill is cut on the cold one's chunk boundaries: warm == cold); a conversation "
         "continued in its slot or from a slot file resumes at its committed position, off the "
         "grid: bitwise its own history, not a cold request for its whole text",
         std::nullopt, ""});
  }
  out.push_back({"prefill_chunk", std::to_string(c.prefill_chunk), true,
                 "prefill bits depend on the chunk size (NRMSE ~4e-7 between sizes): both arms "
                 "of an A/A must share it; the prefix cache's snapshots sit on its grid",
                 std::nullopt, ""});
}

void AddInjections(const EngineConfig& c, std::vector<KnobFinding>& out) {
  for (const std::string& inj : c.inject) {
    const bool delay = inj.rfind("delay", 0) == 0;
    out.push_back(
        {"inject", inj, true,
         delay ? "sleeps inside a stage's forward: timing only, but with draft_policy latency it "
                 "changes the path"
               : "changes state by design (a positive control): an A/A is equal only when both "
                 "arms carry it",
         delay && c.draft_policy == "latency" && PolicyDrafts(c)
             ? std::optional<PreflightProperty>(PreflightProperty::kFreshRepeat)
             : std::nullopt,
         ""});
  }
}

}  // namespace

const char* PropertyId(PreflightProperty p) {
  for (const PropertyName& n : kProperties)
    if (n.p == p) return n.id;
  return "?";
}

const char* PropertyTitle(PreflightProperty p) {
  for (const PropertyName& n : kProperties)
    if (n.p == p) return n.title;
  return "?";
}

std::optional<PreflightProperty> ParsePropertyId(std::string_view id) {
  for (const PropertyName& n : kProperties)
    if (id == n.id) return n.p;
  return std::nullopt;
}

const std::vector<PreflightProperty>& AllPreflightProperties() {
  static const std::vector<PreflightProperty> all = [] {
    std::vector<PreflightProperty> v;
    for (const PropertyName& n : kProperties) v.push_back(n.p);
    return v;
  }();
  return all;
}

std::vector<KnobFinding> StaticKnobs(const EngineConfig& cfg, int hardware_threads) {
  std::vector<KnobFinding> out;
  AddBackend(cfg, hardware_threads, out);
  AddService(cfg, out);
  AddTiming(cfg, out);
  AddInjections(cfg, out);
  return out;
}

Claim ClaimOf(const EngineConfig& c, PreflightProperty p) {
  switch (p) {
    case PreflightProperty::kFreshRepeat:
      return {true, "an A/A compares two fresh runs of this config"};
    case PreflightProperty::kIndexTiming:
      if (SuffixDrafts(c))
        return {true, "suffix drafts are on (spec " + std::to_string(c.spec) +
                          ", spec_max_suffix " + std::to_string(c.spec_max_suffix) + ")"};
      return {false, "no suffix drafts (spec 0, spec_max_suffix 0 or replayed drafts)"};
    case PreflightProperty::kLoad:
      if (c.slots > 1)
        return {true, "slots " + std::to_string(c.slots) + ": requests share engine steps"};
      return {false, "slots 1: one request per engine"};
    case PreflightProperty::kColdWarm:
      if (c.prefix_cache) return {true, "prefix_cache on"};
      return {false, "prefix_cache off: every request is cold"};
    case PreflightProperty::kVerifySingle:
      if (Speculative(c)) return {true, "verify windows of several rows (spec or replay)"};
      return {false, "spec 0: every window has T = 1"};
    case PreflightProperty::kThreads:
      return {false, "the cpu backend is bitwise for a fixed thread count only (threads " +
                         (c.threads > 0 ? std::to_string(c.threads) : std::string("auto")) + ")"};
    case PreflightProperty::kEngineAge:
      if (c.slots > 1 || c.prefix_cache)
        return {true, "an engine that serves many requests (slots " + std::to_string(c.slots) +
                          ", prefix_cache " + (c.prefix_cache ? "on" : "off") + ")"};
      return {false, "slots 1, prefix_cache off: one request per engine"};
  }
  return {false, "?"};
}

const char* ProbeResultName(ProbeResult r) {
  switch (r) {
    case ProbeResult::kNotRun:
      return "not_run";
    case ProbeResult::kHolds:
      return "holds";
    case ProbeResult::kDiffers:
      return "differs";
    case ProbeResult::kNotProvoked:
      return "not_provoked";
    case ProbeResult::kNotApplicable:
      return "n/a";
  }
  return "?";
}

bool PropertyResult::Fails() const {
  if (!claim.claimed) return false;
  // A claimed property whose probe ran but could not check it (nothing compared, the request
  // never shared a step, the warm request reused nothing, the stall did not fire) is not shown
  // to hold: no PASS after checking nothing.
  return result == ProbeResult::kDiffers || result == ProbeResult::kNotProvoked ||
         result == ProbeResult::kNotApplicable || !broken_by.empty();
}

bool PreflightReport::passed() const {
  for (const PropertyResult& p : properties)
    if (p.Fails()) return false;
  return !sweep.ran || sweep.passed();
}

std::string PreflightReport::FailingSummary() const {
  std::string ids;
  int n = 0;
  for (const PropertyResult& p : properties)
    if (p.Fails()) ids += (n++ ? ", " : "") + std::string(PropertyId(p.property));
  std::string out = std::to_string(n) + " claimed propert" + (n == 1 ? "y does" : "ies do") +
                    " not hold" + (n > 0 ? ": " + ids : std::string());
  if (const SweepPoint* f = sweep.ran ? sweep.FirstFailing() : nullptr)
    out += "; the sweep " + std::string(f->result == ProbeResult::kDiffers ? "differs" : "fails") +
           " first at " + f->Label();
  return out;
}

std::string PreflightReport::VerdictLine() const {
  std::string failing;
  int claimed = 0;
  for (const PropertyResult& p : properties) {
    claimed += p.claim.claimed;
    if (!p.Fails()) continue;
    std::string why;
    for (const std::string& k : p.broken_by) why += (why.empty() ? "" : ", ") + k;
    const bool unchecked = p.result == ProbeResult::kNotApplicable && p.broken_by.empty();
    const std::string what = p.result == ProbeResult::kDiffers ? "differs"
                             : p.result == ProbeResult::kNotProvoked
                                 ? "broken by design, not provoked"
                             : unchecked ? "not verified: " + p.reason
                                         : "broken by design, not probed";
    failing += (failing.empty() ? "" : "; ") + std::string(PropertyId(p.property)) + " " + what +
               (why.empty() ? "" : " (" + why + ")");
  }
  int not_probed = 0;
  for (const PropertyResult& p : properties)
    not_probed += p.claim.claimed && p.result == ProbeResult::kNotRun;
  if (sweep.ran && !sweep.passed()) {
    const SweepPoint* f = sweep.FirstFailing();
    failing +=
        (failing.empty() ? "" : "; ") + std::string("sweep ") +
        (f == nullptr                         ? "has no point"
         : f->result == ProbeResult::kDiffers ? "differs first at " + f->Label()
                                              : "did not verify " + f->Label() + ": " + f->reason);
  }
  if (failing.empty() && not_probed > 0 && !sweep.ran)
    return "preflight: PASS (static part only): no active knob breaks what the config claims (" +
           std::to_string(claimed) + " claimed, " + std::to_string(not_probed) + " not probed)";
  if (failing.empty() && sweep.ran)
    return "preflight: PASS: every sweep point is bitwise the solo run (" +
           std::to_string(sweep.points.size()) + " points)";
  if (failing.empty())
    return "preflight: PASS: every property the config claims holds (" + std::to_string(claimed) +
           " claimed)";
  return "preflight: FAIL: not deterministic: " + failing;
}

}  // namespace lockstep
