// Service arms' plan keys (campaigns/README.md, "Service arms"): an arm's `server`, `prime` and
// `load`, and the [service] table. Part of PlanParser (plan_parser.h); the runner side is
// harness/campaign/service_arm.cpp.
#include "campaign/plan_parser.h"
#include "campaign/service_arm.h"

namespace lockstep::plan_internal {

const std::vector<std::string>& RequestLevelKeys() {
  static const std::vector<std::string> kKeys{"seed",  "temperature", "top_k",
                                              "top_p", "max_new",     "ignore_eos"};
  return kKeys;
}

Status PlanParser::ParseArmService(const toml::table& t, ArmSpec& arm,
                                   const KeyLocations& locs) const {
  const std::string label = "arm '" + arm.name + "'";
  if (const toml::node* n = t.get("server")) {
    LOCKSTEP_ASSIGN_OR_RETURN(arm.server, String(*n, "server"));
    if (arm.server != "process" && arm.server != "fresh" && arm.server != "shared")
      return Error(n->source(),
                   label + ": 'server' must be process, fresh or shared, got '" + arm.server + "'");
  }
  for (const char* key : {"prime", "load"}) {
    const toml::node* n = t.get(key);
    if (n != nullptr && arm.server == "process")
      return Error(n->source(), label + ": '" + key +
                                    "' applies to a service arm (server = \"fresh\" or "
                                    "\"shared\"), not to a process arm");
  }
  LOCKSTEP_RETURN_IF_ERROR(OptBool(t, "prime", arm.prime));
  if (arm.server == "shared") {
    for (const auto& [key, where] : locs)
      if (!Contains(RequestLevelKeys(), key))
        return Error(where, label +
                                ": a shared arm runs on the campaign's server (its engine is the "
                                "[engine] table's) and may override request keys only (" +
                                Join(RequestLevelKeys()) + "), not '" + key +
                                "' (use server = \"fresh\")");
  }
  const toml::node* n = t.get("load");
  if (n == nullptr) return Status::Ok();
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::table* lt, Table(*n, "load"));
  LOCKSTEP_RETURN_IF_ERROR(
      CheckKeys(*lt, "in " + label + " load",
                {"requests", "concurrency", "prompt_tokens", "max_new", "seed", "timeout_s"}));
  LoadSpec spec;
  LOCKSTEP_RETURN_IF_ERROR(OptInteger(*lt, "requests", 1, 100000, spec.requests));
  LOCKSTEP_RETURN_IF_ERROR(OptInteger(*lt, "concurrency", 1, 1024, spec.concurrency));
  LOCKSTEP_RETURN_IF_ERROR(OptInteger(*lt, "max_new", 1, 1 << 20, spec.max_new));
  LOCKSTEP_RETURN_IF_ERROR(OptInteger(*lt, "seed", 0, kInt64Max, spec.seed));
  LOCKSTEP_RETURN_IF_ERROR(OptNumber(*lt, "timeout_s", 1.0, spec.timeout_s));
  if (const toml::node* p = lt->get("prompt_tokens")) {
    const toml::array* a = p->as_array();
    if (a == nullptr || a->size() != 2)
      return TypeError(*p, "prompt_tokens", "an array [lo, hi] of two integers");
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t lo, Integer(*a->get(0), "prompt_tokens", 1, 1 << 20));
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t hi, Integer(*a->get(1), "prompt_tokens", lo, 1 << 20));
    spec.prompt_lo = static_cast<int>(lo);
    spec.prompt_hi = static_cast<int>(hi);
  }
  arm.load = spec;
  return Status::Ok();
}

Status PlanParser::CheckLoadSlots(const Campaign& c, const ArmSpec& arm,
                                  const toml::table& t) const {
  if (!arm.load) return Status::Ok();
  auto cfg = EffectiveConfig(c, arm, "preset");
  if (!cfg.ok()) return cfg.status();  // CheckArmConfig has already reported a bad config
  if (cfg->slots >= 2) return Status::Ok();
  return Error(t.get("load")->source(),
               "arm '" + arm.name +
                   "': 'load' shares the arm's engine steps with other requests: "
                   "its engine needs slots >= 2 (slots = " +
                   std::to_string(cfg->slots) + "; set slots in [engine])");
}

Status PlanParser::ParseService(const toml::table& t, ServiceSpec& s) const {
  s.line = static_cast<int>(t.source().begin.line);
  LOCKSTEP_ASSIGN_OR_RETURN(const toml::node* url, Required(t, "url", "[service]"));
  LOCKSTEP_ASSIGN_OR_RETURN(s.url, String(*url, "url"));
  auto parsed = ParseServiceUrl(s.url);
  if (!parsed.ok()) return Error(url->source(), parsed.status().message());
  LOCKSTEP_RETURN_IF_ERROR(OptString(t, "api_key_env", s.api_key_env, /*allow_empty=*/true));
  if (!s.api_key_env.empty() && !ValidEnvName(s.api_key_env))
    return Error(t.get("api_key_env")->source(),
                 "'api_key_env' must name an environment variable ([A-Za-z_][A-Za-z0-9_]*), "
                 "got '" +
                     s.api_key_env + "'");
  return Status::Ok();
}

Status PlanParser::ParseArmPlacement(const toml::table& t, ArmSpec& arm,
                                     const std::vector<std::string>& earlier_names) const {
  const std::string label = "arm '" + arm.name + "'";
  const toml::node* same = t.get("same_host_as");
  const toml::node* placement = t.get("placement");
  if (same != nullptr && placement != nullptr)
    return Error(placement->source(),
                 label + ": give 'same_host_as' or 'placement' = \"spread\", not both");
  if (same != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(arm.same_host_as, Name(*same, "same_host_as"));
    if (!Contains(earlier_names, arm.same_host_as))
      return Error(same->source(),
                   label + ": same_host_as '" + arm.same_host_as +
                       "' is not an earlier arm (earlier arms: " +
                       (earlier_names.empty() ? std::string("none") : Join(earlier_names)) + ")");
  }
  if (placement != nullptr) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string p, String(*placement, "placement"));
    if (p != "spread")
      return Error(placement->source(), label + ": 'placement' must be \"spread\", got '" + p +
                                            "' (same host: same_host_as = \"ARM\")");
    arm.spread = true;
  }
  return Status::Ok();
}

}  // namespace lockstep::plan_internal
