// The campaign plan parser's class and helpers, private to harness/campaign: PlanParser turns the
// TOML document into a Campaign (campaign.h). Its typed value readers (every error as
// file:line:column naming the key, what was wanted and what was found) are in plan_values.cpp,
// the section parsers and the cross-checks in plan.cpp. One parser per plan, one thread.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// toml++ 3.3 asserts that a table header starts with a key character: malformed plans such as
// `[[=arm]]` abort builds without NDEBUG, although its error path reports them correctly (as in
// release builds). Plans are user input: such a file is a syntax error in every build type.
#ifndef TOML_ASSERT
#define TOML_ASSERT(expr) static_assert(true)
#endif
#include <toml++/toml.h>

#include "lockstep/engine/model_config.h"
#include "lockstep/engine/status.h"
#include "lockstep/harness/campaign.h"

namespace lockstep::plan_internal {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

std::string Join(const std::vector<std::string>& v, std::string_view sep = ", ");
bool Contains(const std::vector<std::string>& v, const std::string& s);
// Arm, decision, campaign and stop-rule names: [A-Za-z0-9_.-]+.
bool ValidName(std::string_view s);
// A TOML node's type as toml++ names it ("string", "integer", "table", ...).
std::string TypeName(const toml::node& n);
// The engine keys a shared arm may override: the request's own fields (seed, temperature, top_k,
// top_p, max_new, ignore_eos), which `lockstep serve` takes per request.
const std::vector<std::string>& RequestLevelKeys();
// The engine keys a plan may set, with their JSON types: the canonical JSON of the defaults.
const nlohmann::json& EngineDefaults();
// Those keys, comma-separated, for messages (model and replay_path are not plan keys).
std::string EngineKeyList();

using KeyLocations = std::map<std::string, toml::source_region>;

class PlanParser {
 public:
  PlanParser(std::string source, std::string plan_dir)
      : source_(std::move(source)), plan_dir_(std::move(plan_dir)) {}

  Result<Campaign> Parse(std::string_view text);

 private:
  std::string At(const toml::source_region& r) const {
    return source_ + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
  }
  Status Error(const toml::source_region& r, std::string_view detail) const {
    return Status::InvalidArgument(At(r), detail);
  }
  Status TypeError(const toml::node& n, std::string_view key, std::string_view want) const {
    return Error(n.source(), "'" + std::string(key) + "' must be " + std::string(want) + ", got " +
                                 TypeName(n));
  }

  Status CheckKeys(const toml::table& t, std::string_view where,
                   const std::vector<std::string>& allowed) const;
  Result<const toml::table*> Table(const toml::node& n, std::string_view key) const;
  // The table under `key` (nullptr when absent) with its keys checked; `where` names it
  // ("[gates.path]").
  Result<const toml::table*> OptTable(const toml::table& t, std::string_view key,
                                      std::string_view where,
                                      const std::vector<std::string>& allowed) const;
  Result<const toml::node*> Required(const toml::table& t, std::string_view key,
                                     std::string_view where) const {
    const toml::node* n = t.get(key);
    if (n == nullptr)
      return Error(t.source(),
                   std::string(where) + ": missing required key '" + std::string(key) + "'");
    return n;
  }
  Result<std::string> String(const toml::node& n, std::string_view key,
                             bool allow_empty = false) const;
  Result<std::string> Name(const toml::node& n, std::string_view key) const;
  Result<std::int64_t> Integer(const toml::node& n, std::string_view key, std::int64_t lo,
                               std::int64_t hi) const;
  Result<double> Number(const toml::node& n, std::string_view key, double lo) const;
  Result<bool> Bool(const toml::node& n, std::string_view key) const;
  Result<std::vector<std::string>> StringList(
      const toml::node& n, std::string_view key,
      std::vector<const toml::node*>* elements = nullptr) const;
  Result<std::string> ExistingPath(const toml::node& n, std::string_view key, bool folder) const;
  Result<nlohmann::json> EngineValue(const toml::node& n, const std::string& key,
                                     const nlohmann::json& want) const;

  // Optional keys of `t`: `out` keeps its default when the key is absent.
  Status OptBool(const toml::table& t, std::string_view key, bool& out) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::Ok();
    LOCKSTEP_ASSIGN_OR_RETURN(out, Bool(*n, key));
    return Status::Ok();
  }
  Status OptString(const toml::table& t, std::string_view key, std::string& out,
                   bool allow_empty = false) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::Ok();
    LOCKSTEP_ASSIGN_OR_RETURN(out, String(*n, key, allow_empty));
    return Status::Ok();
  }
  template <typename T>  // double | std::optional<double>
  Status OptNumber(const toml::table& t, std::string_view key, double lo, T& out) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::Ok();
    LOCKSTEP_ASSIGN_OR_RETURN(out, Number(*n, key, lo));
    return Status::Ok();
  }
  template <typename T>  // an integer type holding [lo, hi]
  Status OptInteger(const toml::table& t, std::string_view key, std::int64_t lo, std::int64_t hi,
                    T& out) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::Ok();
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t x, Integer(*n, key, lo, hi));
    out = static_cast<T>(x);
    return Status::Ok();
  }

  Status ParseModel(const toml::table& t, ModelSpec& m);
  Status ParseModelFile(const toml::table& t, ModelSpec& m);
  Status ParseRequest(const toml::table& t, RequestSpec& r) const;
  Result<nlohmann::json> ParseEngine(const toml::table& t, const std::string& where,
                                     KeyLocations& locs) const;
  Status ParseExport(const toml::table& t, ExportPlan& e) const;
  Status ParseThresholds(const toml::table& t, Thresholds& th) const;
  Status ParseGates(const toml::table& t, GateSpec& g) const;
  Status ParseBuilds(const toml::table& t, Campaign& c) const;
  Status ParseArm(const toml::table& t, Campaign& c);
  // Service arms (plan_service.cpp): the arm's server, prime and load keys; `locs` are its
  // [arm.engine] keys (a shared arm may override request keys only).
  Status ParseArmService(const toml::table& t, ArmSpec& arm, const KeyLocations& locs) const;
  // same_host_as = "ARM" (an earlier arm, not itself) | placement = "spread" (plan_service.cpp).
  Status ParseArmPlacement(const toml::table& t, ArmSpec& arm,
                           const std::vector<std::string>& earlier_names) const;
  // After the arm's config is valid: a load arm's engine must hold 2 or more slots.
  Status CheckLoadSlots(const Campaign& c, const ArmSpec& arm, const toml::table& t) const;
  Status ParseService(const toml::table& t, ServiceSpec& s) const;
  Status ParseStop(const toml::table& t, Campaign& c) const;
  Status AddControlArm(Campaign& c, const toml::node& control_node);
  Status ArmConfigStatus(const Campaign& c, const ArmSpec& arm) const;
  Status CheckArmConfig(const Campaign& c, std::size_t index,
                        const toml::source_region& fallback) const;

  std::string source_, plan_dir_;
  std::optional<ModelConfig>
      model_config_;          // the plan's model (preset, or the folder's config.json)
  KeyLocations engine_locs_;  // campaign [engine] keys -> where their values are
  std::vector<KeyLocations> arm_engine_locs_;  // per declared arm: [arm.engine] keys
};

}  // namespace lockstep::plan_internal
