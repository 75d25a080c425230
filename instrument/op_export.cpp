#include "lockstep/instrument/op_export.h"

#include <nlohmann/json.hpp>

namespace lockstep {

Result<OpWindows> OpWindows::Parse(std::string_view text, std::string_view option) {
  OpWindows w;
  if (text == "all") {
    LOCKSTEP_ASSIGN_OR_RETURN(w.windows_, WindowSelection::Parse("all", option));
    w.prefill_ = true;
    return w;
  }
  std::string rest;
  std::size_t b = 0;
  while (b <= text.size()) {
    std::size_t e = text.find(',', b);
    if (e == std::string_view::npos) e = text.size();
    const std::string_view part = text.substr(b, e - b);
    if (part == "prefill") {
      w.prefill_ = true;
    } else {
      rest += (rest.empty() ? "" : ",") + std::string(part);
    }
    b = e + 1;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(w.windows_,
                            WindowSelection::Parse(rest.empty() ? "none" : rest, option));
  return w;
}

Result<OpDump> OpDump::Parse(std::string_view text) {
  const std::size_t at = text.find('@');
  if (at == std::string_view::npos || at == 0)
    return Status::InvalidArgument("--op-dump '" + std::string(text) + "'",
                                   "expected OPS@WINDOWS (e.g. moe_combine,residual@24-26)");
  OpDump d;
  const std::string_view ops = text.substr(0, at);
  if (ops != "all") {
    std::size_t b = 0;
    while (b <= ops.size()) {
      std::size_t e = ops.find(',', b);
      if (e == std::string_view::npos) e = ops.size();
      const std::string name(ops.substr(b, e - b));
      if (FindOpDef(name) == nullptr)
        return Status::InvalidArgument("--op-dump '" + std::string(text) + "'",
                                       "unknown op '" + name + "'");
      d.ops.push_back(name);
      b = e + 1;
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(d.windows, OpWindows::Parse(text.substr(at + 1), "--op-dump"));
  return d;
}

bool OpDump::Wants(std::string_view op, int window) const {
  if (!windows.Contains(window)) return false;
  if (ops.empty()) return true;
  for (const std::string& o : ops)
    if (o == op) return true;
  return false;
}

void OpCollector::Add(const OpRecord& rec, bool dump) {
  auto it = op_index_.find(rec.def->name);
  int op = 0;
  if (it == op_index_.end()) {
    op = static_cast<int>(ops_.size());
    ops_.push_back(rec.def);
    op_index_.emplace(rec.def->name, op);
  } else {
    op = it->second;
  }
  Record r{rec.window, rec.stage,  rec.layer, op, rec.index, rec.position,
           rec.row,    rec.digest, rec.l2,    -1, 0};
  if (dump && rec.data != nullptr) {
    r.dump_offset = static_cast<std::int64_t>(dump_.size());
    r.dump_len = static_cast<std::int64_t>(rec.width);
    dump_.insert(dump_.end(), rec.data, rec.data + rec.width);
  }
  records_.push_back(r);
}

std::string OpTableEntryJson(const OpDef& def) {
  nlohmann::json inputs = nlohmann::json::array();
  const std::string_view in = def.inputs;
  std::size_t b = 0;
  while (b < in.size()) {
    std::size_t e = in.find(',', b);
    if (e == std::string_view::npos) e = in.size();
    inputs.push_back(std::string(in.substr(b, e - b)));
    b = e + 1;
  }
  nlohmann::json j{{"name", def.name}, {"inputs", inputs}, {"state", def.state}};
  return j.dump();
}

}  // namespace lockstep
