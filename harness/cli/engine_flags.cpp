#include "engine_flags.h"

#include <type_traits>

#include "lockstep/engine/atomic_file.h"

namespace lockstep {

const std::vector<std::string_view>& HelpGroupOrder() {
  static const std::vector<std::string_view> order = {
      kGroupRequest, kGroupModel,       kGroupPipeline, kGroupService,
      kGroupServer,  kGroupSpeculative, kGroupCompare,  kGroupCampaign,
      kGroupExport,  kGroupReports,     kGroupCuda,     kGroupDiagnostics};
  return order;
}

std::string_view EngineGroupName(EngineOptionGroup g) {
  switch (g) {
    case EngineOptionGroup::kRequest:
      return kGroupRequest;
    case EngineOptionGroup::kModel:
      return kGroupModel;
    case EngineOptionGroup::kPipeline:
      return kGroupPipeline;
    case EngineOptionGroup::kService:
      return kGroupService;
    case EngineOptionGroup::kSpeculative:
      return kGroupSpeculative;
    case EngineOptionGroup::kCuda:
      return kGroupCuda;
    case EngineOptionGroup::kDiagnostics:
      return kGroupDiagnostics;
  }
  return kGroupDiagnostics;
}

void EngineFlags::Register(CLI::App& app) {
  const EngineConfig defaults;
  for (const EngineOption& o : EngineOptions()) {
    Slot& s = slots_.emplace_back();
    s.option = &o;
    const std::string flag(o.flag), doc(o.doc);
    bool is_switch = false;
    if (o.parse) {
      s.cli = app.add_option(flag, s.text, doc);
    } else {
      // No table parse: CLI11 reads the field's own type, as the hand-written flags did
      // (its integer and number syntax, a bool as a switch, a string list as a repeatable flag).
      std::visit(
          [&](auto member) {
            using T = std::decay_t<decltype(defaults.*member)>;
            if constexpr (std::is_same_v<T, bool>) {
              s.cli = app.add_flag(flag, s.value.emplace<bool>(), doc);
              is_switch = true;
            } else if constexpr (std::is_same_v<T, DType>) {
              s.cli = app.add_option(flag, s.text, doc);  // a dtype name (ParseKvDtype)
            } else {
              s.cli = app.add_option(flag, s.value.emplace<T>(), doc);
            }
          },
          o.field);
    }
    s.cli->group(std::string(EngineGroupName(o.group)));
    const std::string shown = FormatEngineOption(o, defaults);
    const std::string text = shown.empty() ? std::string(o.default_text) : shown;
    if (!is_switch && !text.empty()) s.cli->default_str(text);
  }
  app.add_option("--config", config_file_,
                 "Base engine config (JSON, as printed by --print-config); flags override it")
      ->group(kGroupModel)
      ->default_str("none");
}

Status EngineFlags::Apply(const Slot& s, EngineConfig& c) const {
  const EngineOption& o = *s.option;
  if (o.parse) return o.parse(o, s.text, c);
  return std::visit(
      [&](auto member) -> Status {
        using T = std::decay_t<decltype(c.*member)>;
        if constexpr (std::is_same_v<T, DType>) {
          LOCKSTEP_ASSIGN_OR_RETURN(c.*member, ParseKvDtype(s.text));
        } else {
          c.*member = std::get<T>(s.value);
        }
        return Status::Ok();
      },
      o.field);
}

Result<EngineConfig> EngineFlags::Build() const {
  EngineConfig c;
  if (!config_file_.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(config_file_, std::size_t{16} << 20));
    LOCKSTEP_ASSIGN_OR_RETURN(c, EngineConfig::FromJson(text, config_file_));
  }
  for (const Slot& s : slots_)
    if (s.cli->count() > 0) LOCKSTEP_RETURN_IF_ERROR(Apply(s, c));
  return c;
}

}  // namespace lockstep
