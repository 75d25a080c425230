// The campaign plan parser (campaign.h: ParseCampaign, LoadCampaign, EffectiveConfig): TOML in,
// a checked Campaign out, every error as file:line:column with the valid keys or values.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <sstream>

#include "campaign/needle_prompt.h"
#include "campaign/plan_parser.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/inject.h"
#include "lockstep/engine/model_config.h"
#include "lockstep/engine/synthetic.h"
#include "lockstep/engine/window_selection.h"
#include "lockstep/harness/builds.h"
#include "lockstep/harness/campaign.h"
#include "lockstep/harness/llama_arm.h"
#include "lockstep/harness/model_init.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

const std::vector<std::string>& StopPredicates() {
  static const std::vector<std::string> kPredicates{
      "path_diverged", "path_diverged_early", "window_timing_unstable", "aggregate_timing_failed",
      "state_failed", "output_differs", "resource_guard", "swap_used", "arm_failed",
      "control_missed",
      // service arms (issue 25)
      "warm_differs_from_cold", "load_changes_state", "load_changes_path",
      "engine_reuse_changes_state"};
  return kPredicates;
}

namespace plan_internal {

namespace fs = std::filesystem;

Status PlanParser::ParseModel(const toml::table& t, ModelSpec& m) {
  const toml::node* path = t.get("path");
  const toml::node* preset = t.get("preset");
  if ((path == nullptr) == (preset == nullptr))
    return Error(t.source(), path != nullptr
                                 ? "[model]: give exactly one of 'path' or 'preset', not both"
                                 : "[model]: give one of 'path' (a checkpoint folder) or 'preset' "
                                   "(tiny | small | seed48 | wide)");
  if (preset != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(m.preset, String(*preset, "preset"));
    auto known = SyntheticConfig(m.preset);
    if (!known.ok()) return Error(preset->source(), known.status().message());
    model_config_ = std::move(known).value();
  }
  for (const char* key : {"seed", "induction", "format", "dtype", "quant", "layers"}) {
    const toml::node* n = t.get(key);
    if (n != nullptr && path != nullptr)
      return Error(n->source(),
                   "'" + std::string(key) + "' applies to a synthetic 'preset' model only");
  }
  LOCKSTEP_RETURN_IF_ERROR(OptInteger(t, "seed", 0, kInt64Max, m.seed));
  LOCKSTEP_RETURN_IF_ERROR(OptBool(t, "induction", m.induction));
  LOCKSTEP_RETURN_IF_ERROR(ParseModelFile(t, m));
  if (path != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(m.path, ExistingPath(*path, "path", /*folder=*/true));
    auto config = ModelConfig::FromFile((fs::path(m.path) / "config.json").string());
    if (!config.ok())
      return Error(path->source(),
                   "'path': '" + path->as_string()->get() +
                       "' is not a checkpoint folder: " + config.status().message());
    model_config_ = std::move(config).value();
  }
  return Status::Ok();
}

// [model] format / dtype / quant / layers (presets only): the file `lockstep model init` writes.
Status PlanParser::ParseModelFile(const toml::table& t, ModelSpec& m) {
  LOCKSTEP_RETURN_IF_ERROR(OptString(t, "format", m.format));
  LOCKSTEP_RETURN_IF_ERROR(OptString(t, "quant", m.quant));
  LOCKSTEP_RETURN_IF_ERROR(OptString(t, "dtype", m.dtype));
  if (auto f = ParseModelFormat(m.format, m.quant); !f.ok()) {
    const bool bad_format = m.format != "safetensors" && m.format != "gguf";
    return Error(t.get(bad_format ? "format" : "quant")->source(), f.status().message());
  }
  if (!m.dtype.empty())
    if (auto d = ParseModelDtype(m.dtype); !d.ok())
      return Error(t.get("dtype")->source(), d.status().message());
  if (const toml::node* n = t.get("layers")) {
    const int most = model_config_ ? model_config_->n_layers : kIntMax;
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t layers, Integer(*n, "layers", 1, most));
    m.layers = static_cast<int>(layers);
    if (model_config_) model_config_->n_layers = m.layers;
  }
  return Status::Ok();
}

Status PlanParser::ParseRequest(const toml::table& t, RequestSpec& r) const {
  const std::size_t given = t.size();
  if (given != 1)
    return Error(
        t.source(),
        "[request]: give exactly one of prompt, prompt_file, token_file, chat or needle (got " +
            std::to_string(given) + ")");
  LOCKSTEP_RETURN_IF_ERROR(OptString(t, "prompt", r.prompt));
  if (const toml::node* n = t.get("prompt_file")) {
    LOCKSTEP_ASSIGN_OR_RETURN(r.prompt_file, ExistingPath(*n, "prompt_file", /*folder=*/false));
  }
  if (const toml::node* n = t.get("chat")) {
    LOCKSTEP_ASSIGN_OR_RETURN(r.chat_file, ExistingPath(*n, "chat", /*folder=*/false));
  }
  if (const toml::node* n = t.get("token_file")) {
    LOCKSTEP_ASSIGN_OR_RETURN(r.token_file, ExistingPath(*n, "token_file", /*folder=*/false));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* nt, OptTable(t, "needle", "[request.needle]",
                                                            {"tokens", "needles", "seed"}));
  if (nt != nullptr) {
    NeedleSpec spec;
    LOCKSTEP_ASSIGN_OR_RETURN(const toml::node* tokens,
                              Required(*nt, "tokens", "[request.needle]"));
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t tok,
                              Integer(*tokens, "tokens", kMinNeedleTokens, kMaxNeedleTokens));
    spec.tokens = static_cast<int>(tok);
    LOCKSTEP_RETURN_IF_ERROR(OptInteger(*nt, "needles", 1, kMaxNeedles, spec.needles));
    LOCKSTEP_RETURN_IF_ERROR(OptInteger(*nt, "seed", 0, kInt64Max, spec.seed));
    if (tok < NeedleMinTokens(spec.needles))
      return Error(tokens->source(), "'tokens': " + std::to_string(spec.needles) +
                                         " needles and the question need " + "at least " +
                                         std::to_string(NeedleMinTokens(spec.needles)) +
                                         " tokens, got " + std::to_string(tok));
    r.needle = spec;
  }
  return Status::Ok();
}

Result<nlohmann::json> PlanParser::ParseEngine(const toml::table& t, const std::string& where,
                                               KeyLocations& locs) const {
  nlohmann::json out = nlohmann::json::object();
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    if (k == "model")
      return Error(key.source(),
                   where + ": 'model' is set by the [model] table, not by engine overrides");
    if (k == "replay_path")
      return Error(key.source(), where + ": 'replay_path' cannot be set in a campaign");
    const bool llama = LlamaPlanDefaults().contains(k);  // llama.cpp arms (llama_arm.h)
    if (!EngineDefaults().contains(k) && !llama)
      return Error(key.source(), where + ": unknown engine field '" + k +
                                     "' (EngineConfig keys: " + EngineKeyList() + ")");
    const nlohmann::json& def = llama ? LlamaPlanDefaults()[k] : EngineDefaults()[k];
    if (def.is_array()) {
      const toml::array* a = node.as_array();
      // Element types of the list keys (others: any scalar, FromJson checks them).
      const nlohmann::json elem = k == "split"    ? nlohmann::json(0)
                                  : k == "inject" ? nlohmann::json("")
                                                  : nlohmann::json();
      const char* want = k == "split"    ? "an array of integers"
                         : k == "inject" ? "an array of strings"
                                         : "an array";
      if (a == nullptr) return TypeError(node, k, want);
      nlohmann::json arr = nlohmann::json::array();
      for (const toml::node& e : *a) {
        auto v = EngineValue(e, k, elem);
        if (!v.ok())
          return Error(e.source(),
                       "'" + k + "' must be " + want + ", got an element of type " + TypeName(e));
        arr.push_back(std::move(v).value());
      }
      out[k] = std::move(arr);
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(out[k], EngineValue(node, k, def));
    }
    locs[k] = node.source();
  }
  return out;
}

Status PlanParser::ParseExport(const toml::table& t, ExportPlan& e) const {
  if (const toml::node* n = t.get("windows")) {
    LOCKSTEP_ASSIGN_OR_RETURN(e.windows, String(*n, "windows"));
    auto sel = WindowSelection::Parse(e.windows, "windows");
    if (!sel.ok()) return Error(n->source(), sel.status().message());
  }
  if (const toml::node* n = t.get("points")) {
    std::vector<const toml::node*> elems;
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::string> points, StringList(*n, "points", &elems));
    if (points.empty())
      return Error(n->source(), "'points' must not be empty (pre_verify, post_verify, commit)");
    for (std::size_t i = 0; i < points.size(); ++i) {
      auto p = ParseExportPoints(points[i], "points");
      if (!p.ok() || points[i].find(',') != std::string::npos)
        return Error(elems[i]->source(), "'points': unknown point '" + points[i] +
                                             "' (expected pre_verify, post_verify or commit)");
      if (std::find(points.begin(), points.begin() + static_cast<std::ptrdiff_t>(i), points[i]) !=
          points.begin() + static_cast<std::ptrdiff_t>(i))
        return Error(elems[i]->source(), "'points': '" + points[i] + "' is listed twice");
    }
    e.points = std::move(points);
  }
  LOCKSTEP_RETURN_IF_ERROR(OptInteger(t, "sample_ms", 1, 3600000, e.sample_ms));
  return Status::Ok();
}

Status PlanParser::ParseThresholds(const toml::table& t, Thresholds& th) const {
  LOCKSTEP_RETURN_IF_ERROR(OptNumber(t, "nrmse_max", 0.0, th.nrmse_max));
  LOCKSTEP_RETURN_IF_ERROR(OptNumber(t, "kl_max", 0.0, th.kl_max));
  if (const toml::node* n = t.get("kinds")) {
    LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* kinds, Table(*n, "kinds"));
    for (auto&& [key, node] : *kinds) {
      const std::string kind(key.str());
      if (!Contains(ItemKinds(), kind))
        return Error(key.source(), "unknown item kind '" + kind +
                                       "' in [thresholds.kinds] (kinds: " + Join(ItemKinds()) +
                                       ")");
      LOCKSTEP_ASSIGN_OR_RETURN(th.nrmse_by_kind[kind], Number(node, kind, 0.0));
    }
  }
  return Status::Ok();
}

Status PlanParser::ParseGates(const toml::table& t, GateSpec& g) const {
  LOCKSTEP_RETURN_IF_ERROR(OptBool(t, "output", g.output));
  LOCKSTEP_RETURN_IF_ERROR(OptBool(t, "state", g.state));
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* p, OptTable(t, "path", "[gates.path]", {"within"}));
  if (p != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(const toml::node* within, Required(*p, "within", "[gates.path]"));
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t w, Integer(*within, "within", 0, kIntMax));
    g.path_within = static_cast<int>(w);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      const toml::table* a,
      OptTable(t, "aggregate_timing", "[gates.aggregate_timing]", {"rel_max"}));
  if (a != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(const toml::node* rel,
                              Required(*a, "rel_max", "[gates.aggregate_timing]"));
    LOCKSTEP_ASSIGN_OR_RETURN(g.aggregate_rel_max, Number(*rel, "rel_max", 0.0));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      const toml::table* w,
      OptTable(t, "window_timing", "[gates.window_timing]", {"abs_ms", "rel"}));
  if (w != nullptr) {
    if (w->empty()) return Error(w->source(), "[gates.window_timing]: give abs_ms, rel or both");
    g.window_abs_ms = 0.0;
    g.window_rel = 0.0;
    LOCKSTEP_RETURN_IF_ERROR(OptNumber(*w, "abs_ms", 0.0, g.window_abs_ms));
    LOCKSTEP_RETURN_IF_ERROR(OptNumber(*w, "rel", 0.0, g.window_rel));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* r, OptTable(t, "resources", "[gates.resources]",
                                                           {"no_swap", "min_free_mib"}));
  if (r != nullptr) {
    g.resources = true;
    LOCKSTEP_RETURN_IF_ERROR(OptBool(*r, "no_swap", g.no_swap));
    LOCKSTEP_RETURN_IF_ERROR(OptInteger(*r, "min_free_mib", 0, kInt64Max, g.min_free_mib));
  }
  LOCKSTEP_RETURN_IF_ERROR(OptInteger(t, "max_skipped", -1, kInt64Max, g.max_skipped));
  LOCKSTEP_RETURN_IF_ERROR(OptBool(t, "exact", g.exact));
  if (g.exact && !g.state)
    if (const toml::node* n = t.get("exact"))
      return Error(n->source(),
                   "'exact' asks the state gate for bitwise equality: set state = true");
  return Status::Ok();
}

// Build names and their paths (relative to the plan's folder); existence is checked when the
// campaign starts, after the command line's --build overrides (builds.h).
Status PlanParser::ParseBuilds(const toml::table& t, Campaign& c) const {
  for (auto&& [key, node] : t) {
    const std::string name(key.str());
    if (!ValidName(name))
      return Error(key.source(), "build name '" + name + "' must match [A-Za-z0-9_.-]+");
    if (name == kSelfBuild)
      return Error(key.source(),
                   "build name 'self' is taken (arms without 'build' run on the "
                   "running executable, recorded as 'self')");
    LOCKSTEP_ASSIGN_OR_RETURN(std::string path, String(node, name));
    fs::path p(path);
    if (p.is_relative()) p = fs::path(plan_dir_) / p;
    c.builds[name] = p.lexically_normal().string();
  }
  return Status::Ok();
}

Status PlanParser::ParseArm(const toml::table& t, Campaign& c) {
  LOCKSTEP_RETURN_IF_ERROR(
      CheckKeys(t, "in [[arm]]",
                {"name", "mode", "repeat", "baseline", "require", "decision", "engine",
                 "max_skipped", "build", "server", "prime", "load", "same_host_as", "placement"}));
  ArmSpec arm;
  arm.line = static_cast<int>(t.source().begin.line);
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::node* name, Required(t, "name", "[[arm]]"));
  LOCKSTEP_ASSIGN_OR_RETURN(arm.name, Name(*name, "name"));
  for (const ArmSpec& earlier : c.arms) {
    if (earlier.name == arm.name)
      return Error(name->source(), "duplicate arm name '" + arm.name +
                                       "' (first declared at line " + std::to_string(earlier.line) +
                                       ")");
  }
  const std::string label = "arm '" + arm.name + "'";
  if (const toml::node* n = t.get("mode")) {
    LOCKSTEP_ASSIGN_OR_RETURN(arm.mode, String(*n, "mode"));
    if (arm.mode != "state" && arm.mode != "timing")
      return Error(n->source(), label + ": 'mode' must be state or timing, got '" + arm.mode + "'");
  }
  if (const toml::node* n = t.get("repeat")) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t repeat, Integer(*n, "repeat", 1, 1000000));
    if (arm.mode == "state" && repeat != 1)
      return Error(n->source(), label + ": a state arm runs once ('repeat' must be 1, got " +
                                    std::to_string(repeat) +
                                    "); repeat a mode = \"timing\" arm instead");
    arm.repeat = static_cast<int>(repeat);
  }
  std::vector<std::string> earlier_names, decisions;
  for (const ArmSpec& earlier : c.arms) {
    earlier_names.push_back(earlier.name);
    if (!earlier.decision.empty()) decisions.push_back(earlier.decision);
  }
  if (const toml::node* n = t.get("baseline")) {
    LOCKSTEP_ASSIGN_OR_RETURN(arm.baseline, String(*n, "baseline"));
    if (arm.baseline == arm.name)
      return Error(n->source(), label + ": an arm cannot be its own baseline");
    if (!Contains(earlier_names, arm.baseline))
      return Error(n->source(),
                   label + ": baseline '" + arm.baseline +
                       "' is not an earlier arm (earlier arms: " +
                       (earlier_names.empty() ? std::string("none") : Join(earlier_names)) + ")");
  }
  if (const toml::node* n = t.get("require")) {
    std::vector<const toml::node*> elems;
    LOCKSTEP_ASSIGN_OR_RETURN(arm.require, StringList(*n, "require", &elems));
    for (std::size_t i = 0; i < arm.require.size(); ++i) {
      if (!Contains(decisions, arm.require[i]))
        return Error(elems[i]->source(),
                     label + ": requires decision '" + arm.require[i] +
                         "', which no earlier arm declares (declared: " +
                         (decisions.empty() ? std::string("none") : Join(decisions)) + ")");
    }
  }
  if (const toml::node* n = t.get("decision")) {
    LOCKSTEP_ASSIGN_OR_RETURN(arm.decision, Name(*n, "decision"));
    if (arm.baseline.empty())
      return Error(
          n->source(),
          label + ": 'decision' needs a 'baseline' (a decision is the verdict of a comparison)");
    if (Contains(decisions, arm.decision))
      return Error(n->source(), label + ": decision '" + arm.decision +
                                    "' is already declared by an earlier arm");
  }
  if (const toml::node* n = t.get("max_skipped")) {
    LOCKSTEP_ASSIGN_OR_RETURN(arm.max_skipped, Integer(*n, "max_skipped", -1, kInt64Max));
  }
  if (const toml::node* n = t.get("build")) {
    LOCKSTEP_ASSIGN_OR_RETURN(arm.build, Name(*n, "build"));
    if (!c.builds.count(arm.build)) {
      std::vector<std::string> names;
      for (const auto& [b, path] : c.builds) names.push_back(b);
      return Error(n->source(), label + ": build '" + arm.build +
                                    "' is not declared in [builds] (" +
                                    (names.empty() ? std::string("none is") : Join(names)) + ")");
    }
  }
  KeyLocations locs;
  if (const toml::node* n = t.get("engine")) {
    LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* e, Table(*n, "engine"));
    LOCKSTEP_ASSIGN_OR_RETURN(arm.engine, ParseEngine(*e, label + " [arm.engine]", locs));
  }
  LOCKSTEP_RETURN_IF_ERROR(ParseArmService(t, arm, locs));
  LOCKSTEP_RETURN_IF_ERROR(ParseArmPlacement(t, arm, earlier_names));
  c.arms.push_back(std::move(arm));
  arm_engine_locs_.push_back(std::move(locs));
  LOCKSTEP_RETURN_IF_ERROR(CheckArmConfig(c, c.arms.size() - 1, t.source()));
  return CheckLoadSlots(c, c.arms.back(), t);
}

Status PlanParser::ParseStop(const toml::table& t, Campaign& c) const {
  LOCKSTEP_RETURN_IF_ERROR(
      CheckKeys(t, "in [[stop]]", {"name", "when", "predicates", "message", "arms"}));
  StopRule rule;
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::node* name, Required(t, "name", "[[stop]]"));
  LOCKSTEP_ASSIGN_OR_RETURN(rule.name, Name(*name, "name"));
  for (const StopRule& earlier : c.stop) {
    if (earlier.name == rule.name)
      return Error(name->source(), "duplicate stop rule name '" + rule.name + "'");
  }
  const std::string label = "stop rule '" + rule.name + "'";
  if (const toml::node* n = t.get("when")) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string when, String(*n, "when"));
    if (when != "any" && when != "all")
      return Error(n->source(), label + ": 'when' must be any or all, got '" + when + "'");
    rule.all = when == "all";
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::node* preds, Required(t, "predicates", label));
  std::vector<const toml::node*> elems;
  LOCKSTEP_ASSIGN_OR_RETURN(rule.predicates, StringList(*preds, "predicates", &elems));
  if (rule.predicates.empty())
    return Error(preds->source(), label + ": 'predicates' must not be empty");
  for (std::size_t i = 0; i < rule.predicates.size(); ++i) {
    if (!Contains(StopPredicates(), rule.predicates[i]))
      return Error(elems[i]->source(), label + ": unknown predicate '" + rule.predicates[i] +
                                           "' (valid: " + Join(StopPredicates()) + ")");
  }
  if (const toml::node* n = t.get("arms")) {
    std::vector<const toml::node*> arm_elems;
    LOCKSTEP_ASSIGN_OR_RETURN(rule.arms, StringList(*n, "arms", &arm_elems));
    std::vector<std::string> compared;
    for (const ArmSpec& a : c.arms)
      if (!a.baseline.empty()) compared.push_back(a.name);
    for (std::size_t i = 0; i < rule.arms.size(); ++i)
      if (!Contains(compared, rule.arms[i]))
        return Error(arm_elems[i]->source(), label + ": 'arms' names '" + rule.arms[i] +
                                                 "', which is not an arm with a baseline (" +
                                                 Join(compared) + ")");
  }
  rule.message = label + " fired";
  LOCKSTEP_RETURN_IF_ERROR(OptString(t, "message", rule.message));
  c.stop.push_back(std::move(rule));
  return Status::Ok();
}

// The positive control: the first arm again (its overrides), with the control injection appended to
// its effective inject list, compared against the first arm. Its gates must fail.
Status PlanParser::AddControlArm(Campaign& c, const toml::node& control_node) {
  const ArmSpec& first = c.arms.front();
  if (first.mode != "state")
    return Error(control_node.source(),
                 "'control' needs the first arm (its baseline) to be a state arm, but arm '" +
                     first.name + "' is a timing arm");
  for (const ArmSpec& arm : c.arms) {
    if (arm.name == "control")
      return Error(control_node.source(),
                   "'control' adds an arm named 'control', but the arm declared at line " +
                       std::to_string(arm.line) + " already has that name");
  }
  ArmSpec control;
  control.name = "control";
  control.mode = "state";
  control.baseline = first.name;
  control.control = true;
  control.line = static_cast<int>(control_node.source().begin.line);
  control.engine = first.engine;
  control.build = first.build;  // it differs from its baseline only by the injection
  // A service first arm: the control runs on its own fresh server (its injection is an engine
  // key, which neither the shared server nor a remote one takes per request), primed like it.
  if (first.server != "process") {
    control.server = "fresh";
    control.prime = first.prime;
  }
  nlohmann::json inject = first.engine.contains("inject") ? first.engine["inject"]
                          : c.engine.contains("inject")   ? c.engine["inject"]
                                                          : nlohmann::json::array();
  inject.push_back(c.control);
  control.engine["inject"] = std::move(inject);
  c.arms.push_back(std::move(control));
  return CheckArmConfig(c, c.arms.size() - 1, control_node.source());
}

// The arm's effective config, and its stage split against the model's layers.
Status PlanParser::ArmConfigStatus(const Campaign& c, const ArmSpec& arm) const {
  const std::string model = c.model.path.empty() ? "preset:" + c.model.preset : c.model.path;
  LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EffectiveConfig(c, arm, model));
  LOCKSTEP_RETURN_IF_ERROR(CheckArmEngine(c, arm, cfg));
  if (model_config_.has_value() && !IsLlamaArm(c, arm)) {
    auto bounds = cfg.StageBoundaries(*model_config_);
    if (!bounds.ok()) return bounds.status().WithContext("arm '" + arm.name + "'");
  }
  return Status::Ok();
}

// Validates the arm's effective config now, so a bad value fails before anything runs. The error
// points at the engine key responsible: the first one (arm overrides, then [engine]) whose removal
// changes the error; else at `fallback`.
Status PlanParser::CheckArmConfig(const Campaign& c, std::size_t index,
                                  const toml::source_region& fallback) const {
  const ArmSpec& arm = c.arms[index];
  const Status st = ArmConfigStatus(c, arm);
  if (st.ok()) return st;
  const std::string& msg = st.message();
  auto implicated = [&](const Campaign& cc, const ArmSpec& a) {
    const Status other = ArmConfigStatus(cc, a);
    return other.ok() || other.message() != msg;
  };
  if (index < arm_engine_locs_.size()) {
    for (const auto& [key, where] : arm_engine_locs_[index]) {
      ArmSpec without = arm;
      without.engine.erase(key);
      if (implicated(c, without)) return Error(where, msg + " (engine key '" + key + "')");
    }
  }
  for (const auto& [key, where] : engine_locs_) {
    if (arm.engine.contains(key)) continue;
    Campaign without;
    without.model = c.model;
    without.engine = c.engine;
    without.engine.erase(key);
    if (implicated(without, arm))
      return Error(where, msg + " (engine key '" + key + "' in [engine])");
  }
  return Error(fallback, msg);
}

Result<Campaign> PlanParser::Parse(std::string_view text) {
  toml::table root;
  try {
    root = toml::parse(text, source_);
  } catch (const toml::parse_error& e) {
    return Error(e.source(), "TOML syntax error: " + std::string(e.description()));
  }
  toml::source_region top;
  top.begin = toml::source_position{1, 1};
  LOCKSTEP_RETURN_IF_ERROR(
      CheckKeys(root, "at the top level",
                {"name", "question", "hypothesis", "control", "min_timing_repeats", "localize",
                 "model", "request", "engine", "export", "thresholds", "gates", "arm", "stop",
                 "builds", "service", "order", "order_seed"}));
  Campaign c;
  c.plan_dir = plan_dir_;
  c.plan_text = std::string(text);
  c.plan_sha256 = Sha256Hex(text);

  const toml::node* name = root.get("name");
  if (name == nullptr)
    return Error(top, "missing required key 'name' (the campaign's name, [A-Za-z0-9_.-]+)");
  LOCKSTEP_ASSIGN_OR_RETURN(c.name, Name(*name, "name"));
  const toml::node* question = root.get("question");
  if (question == nullptr)
    return Error(top, "missing required key 'question' (what the campaign asks)");
  LOCKSTEP_ASSIGN_OR_RETURN(c.question, String(*question, "question"));
  LOCKSTEP_RETURN_IF_ERROR(OptString(root, "hypothesis", c.hypothesis, /*allow_empty=*/true));
  LOCKSTEP_RETURN_IF_ERROR(
      OptInteger(root, "min_timing_repeats", 2, 1000000, c.min_timing_repeats));
  if (const toml::node* n = root.get("order")) {
    LOCKSTEP_ASSIGN_OR_RETURN(c.order, String(*n, "order"));
    if (c.order != "plan" && c.order != "abba" && c.order != "random")
      return Error(n->source(), "'order' must be plan, abba or random, got '" + c.order + "'");
  }
  if (const toml::node* n = root.get("order_seed")) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t seed, Integer(*n, "order_seed", 0, kInt64Max));
    if (c.order != "random")
      return Error(n->source(), "'order_seed' applies to order = \"random\" only");
    c.order_seed = static_cast<std::uint64_t>(seed);
  }
  LOCKSTEP_RETURN_IF_ERROR(OptBool(root, "localize", c.localize));

  LOCKSTEP_ASSIGN_OR_RETURN(
      const toml::table* model,
      OptTable(root, "model", "[model]",
               {"path", "preset", "seed", "induction", "format", "dtype", "quant", "layers"}));
  if (model == nullptr)
    return Error(top, "missing [model] table (required: exactly one of path or preset)");
  LOCKSTEP_RETURN_IF_ERROR(ParseModel(*model, c.model));
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* request,
                            OptTable(root, "request", "[request]",
                                     {"prompt", "prompt_file", "token_file", "chat", "needle"}));
  if (request == nullptr)
    return Error(
        top,
        "missing [request] table (required: one of prompt, prompt_file, token_file, chat or "
        "needle)");
  LOCKSTEP_RETURN_IF_ERROR(ParseRequest(*request, c.request));

  if (const toml::node* n = root.get("engine")) {
    LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* t, Table(*n, "engine"));
    LOCKSTEP_ASSIGN_OR_RETURN(c.engine, ParseEngine(*t, "[engine]", engine_locs_));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* ex, OptTable(root, "export", "[export]",
                                                            {"windows", "points", "sample_ms"}));
  if (ex != nullptr) LOCKSTEP_RETURN_IF_ERROR(ParseExport(*ex, c.export_plan));
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* th, OptTable(root, "thresholds", "[thresholds]",
                                                            {"nrmse_max", "kl_max", "kinds"}));
  if (th != nullptr) LOCKSTEP_RETURN_IF_ERROR(ParseThresholds(*th, c.thresholds));
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* gates,
                            OptTable(root, "gates", "[gates]",
                                     {"output", "state", "path", "aggregate_timing",
                                      "window_timing", "resources", "max_skipped", "exact"}));
  if (gates != nullptr) LOCKSTEP_RETURN_IF_ERROR(ParseGates(*gates, c.gates));
  if (const toml::node* n = root.get("builds")) {
    LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* t, Table(*n, "builds"));
    LOCKSTEP_RETURN_IF_ERROR(ParseBuilds(*t, c));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* service,
                            OptTable(root, "service", "[service]", {"url", "api_key_env"}));
  if (service != nullptr) LOCKSTEP_RETURN_IF_ERROR(ParseService(*service, c.service));
  const toml::node* control = root.get("control");
  if (control != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(c.control, String(*control, "control"));
    auto parsed = ParseInjections({c.control});
    if (!parsed.ok()) return Error(control->source(), "'control': " + parsed.status().message());
  }

  const toml::node* arms = root.get("arm");
  if (arms == nullptr) return Error(top, "missing [[arm]] (at least one arm is required)");
  const toml::array* arm_array = arms->as_array();
  if (arm_array == nullptr || (!arm_array->empty() && !arm_array->is_array_of_tables()))
    return TypeError(*arms, "arm", "an array of tables ([[arm]])");
  if (arm_array->empty()) return Error(arms->source(), "at least one [[arm]] is required");
  for (const toml::node& a : *arm_array) LOCKSTEP_RETURN_IF_ERROR(ParseArm(*a.as_table(), c));

  if (const toml::node* n = root.get("stop")) {
    const toml::array* stop_array = n->as_array();
    if (stop_array == nullptr || (!stop_array->empty() && !stop_array->is_array_of_tables()))
      return TypeError(*n, "stop", "an array of tables ([[stop]])");
    for (const toml::node& s : *stop_array) LOCKSTEP_RETURN_IF_ERROR(ParseStop(*s.as_table(), c));
  }
  if (control != nullptr) LOCKSTEP_RETURN_IF_ERROR(AddControlArm(c, *control));

  const bool any_require = std::any_of(c.arms.begin(), c.arms.end(),
                                       [](const ArmSpec& a) { return !a.require.empty(); });
  if (c.stop.empty() && any_require) {
    c.stop.push_back(StopRule{"unstable_aa",
                              false,
                              {"path_diverged", "window_timing_unstable", "aggregate_timing_failed",
                               "state_failed", "output_differs"},
                              "unstable A/A => stop attribution (default rule)",
                              {}});
    c.default_stop = true;
  }
  return c;
}

}  // namespace plan_internal

namespace fs = std::filesystem;
using plan_internal::EngineDefaults;
using plan_internal::PlanParser;

Result<Campaign> ParseCampaign(std::string_view text, const std::string& source,
                               const std::string& plan_dir) {
  std::error_code ec;
  fs::path dir = plan_dir.empty() ? fs::current_path(ec) : fs::absolute(plan_dir, ec);
  if (ec)
    return Status::InvalidArgument(
        source, "cannot resolve the plan folder '" + plan_dir + "': " + ec.message());
  PlanParser parser(source, dir.lexically_normal().string());
  return parser.Parse(text);
}

Result<Campaign> LoadCampaign(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{16} << 20));
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  if (ec) return Status::InvalidArgument(path, "cannot resolve the plan path: " + ec.message());
  return ParseCampaign(text, path, abs.parent_path().string());
}

Result<EngineConfig> EffectiveConfig(const Campaign& c, const ArmSpec& arm,
                                     const std::string& model_dir) {
  const std::string label = "arm '" + arm.name + "'";
  try {
    nlohmann::json merged = EngineDefaults();
    for (auto it = c.engine.begin(); it != c.engine.end(); ++it) merged[it.key()] = it.value();
    for (auto it = arm.engine.begin(); it != arm.engine.end(); ++it) merged[it.key()] = it.value();
    merged["model"] = model_dir;
    for (auto it = LlamaPlanDefaults().begin(); it != LlamaPlanDefaults().end(); ++it)
      merged.erase(it.key());  // llama.cpp's keys (llama_arm.h) are not EngineConfig's
    LOCKSTEP_ASSIGN_OR_RETURN(EngineConfig cfg, EngineConfig::FromJson(merged.dump(), label));
    auto injections = ParseInjections(cfg.inject);
    if (!injections.ok()) return injections.status().WithContext(label);
    // A window at or past max_new never runs (each window emits at least one token).
    for (const Injection& inj : *injections)
      if (inj.window >= 0 && inj.window >= cfg.max_new)
        return Status::InvalidArgument(label + ": --inject '" + inj.text + "'",
                                       "window " + std::to_string(inj.window) +
                                           " never runs: max_new " + std::to_string(cfg.max_new) +
                                           " allows at most " + std::to_string(cfg.max_new) +
                                           " verify windows");
    return cfg;
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(label, std::string("engine overrides: ") + e.what());
  }
}

}  // namespace lockstep
