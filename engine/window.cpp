#include "lockstep/engine/window.h"

#include <nlohmann/json.hpp>

#include "lockstep/engine/atomic_file.h"

namespace lockstep {

const char* DraftSourceName(DraftSource s) {
  switch (s) {
    case DraftSource::kNone:
      return "none";
    case DraftSource::kMtp:
      return "mtp";
    case DraftSource::kSuffix:
      return "suffix";
    case DraftSource::kMerged:
      return "merged";
  }
  return "none";
}

Result<DraftSource> ParseDraftSource(std::string_view s) {
  for (DraftSource d : {DraftSource::kNone, DraftSource::kMtp, DraftSource::kSuffix, DraftSource::kMerged})
    if (s == DraftSourceName(d)) return d;
  return Status::InvalidArgument("draft source", "unknown '" + std::string(s) + "' (expected none, mtp, suffix or merged)");
}

bool WindowRecord::SamePath(const WindowRecord& o) const {
  return idx == o.idx && p == o.p && T == o.T && T_mtp == o.T_mtp && merged == o.merged && from_sfx == o.from_sfx &&
         chain_n == o.chain_n && accepted == o.accepted && source == o.source && draft == o.draft && emitted == o.emitted;
}

std::string WindowRecord::ToJsonLine() const {
  nlohmann::ordered_json j;
  j["schema"] = "lockstep.window";
  j["v"] = 1;
  j["idx"] = idx;
  j["p"] = p;
  j["T"] = T;
  j["T_mtp"] = T_mtp;
  j["merged"] = merged;
  j["from_sfx"] = from_sfx;
  j["chain_n"] = chain_n;
  j["accepted"] = accepted;
  j["source"] = DraftSourceName(source);
  j["draft"] = draft;
  j["emitted"] = emitted;
  j["begin_ns"] = begin_ns;
  j["end_ns"] = end_ns;
  j["draft_ns"] = draft_ns;
  j["verify_ns"] = verify_ns;
  j["wait_ns"] = wait_ns;
  j["compute_ns"] = compute_ns;
  j["commit_ns"] = commit_ns;
  if (export_ns >= 0) {
    j["export_ns"] = export_ns;
  } else {
    j["export_ns"] = nullptr;  // unknown, never zero
  }
  j["first_call"] = first_call;
  nlohmann::json st = nlohmann::json::array();
  for (const auto& s : stages) st.push_back({{"wait_ns", s.wait_ns}, {"compute_ns", s.compute_ns}, {"cpu_ns", s.cpu_ns}});
  j["stages"] = st;
  return j.dump();
}

Result<WindowRecord> WindowRecord::FromJsonLine(std::string_view line, const std::string& label) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const std::exception& e) {
    return Status::InvalidArgument(label, std::string("not a JSON window record: ") + e.what());
  }
  WindowRecord r;
  try {
    if (!j.is_object() || j.value("schema", "") != "lockstep.window")
      return Status::InvalidArgument(label, "not a lockstep.window record (missing \"schema\": \"lockstep.window\")");
    if (j.value("v", 0) != 1) return Status::InvalidArgument(label, "unsupported lockstep.window version");
    r.idx = j.at("idx").get<int>();
    r.p = j.at("p").get<int>();
    r.T = j.at("T").get<int>();
    r.T_mtp = j.at("T_mtp").get<int>();
    r.merged = j.at("merged").get<bool>();
    r.from_sfx = j.at("from_sfx").get<bool>();
    r.chain_n = j.at("chain_n").get<int>();
    r.accepted = j.at("accepted").get<int>();
    LOCKSTEP_ASSIGN_OR_RETURN(r.source, ParseDraftSource(j.at("source").get<std::string>()));
    r.draft = j.at("draft").get<std::vector<std::int32_t>>();
    r.emitted = j.at("emitted").get<std::vector<std::int32_t>>();
    r.begin_ns = j.value("begin_ns", std::int64_t{0});
    r.end_ns = j.value("end_ns", std::int64_t{0});
    r.draft_ns = j.value("draft_ns", std::int64_t{0});
    r.verify_ns = j.value("verify_ns", std::int64_t{0});
    r.wait_ns = j.value("wait_ns", std::int64_t{0});
    r.compute_ns = j.value("compute_ns", std::int64_t{0});
    r.commit_ns = j.value("commit_ns", std::int64_t{0});
    r.export_ns = j.contains("export_ns") && j["export_ns"].is_number() ? j["export_ns"].get<std::int64_t>() : -1;
    r.first_call = j.value("first_call", false);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(label, std::string("bad window record field: ") + e.what());
  }
  if (r.T < 1 || static_cast<int>(r.draft.size()) != r.T - 1 || r.accepted < 0 || r.accepted > r.T - 1 ||
      static_cast<int>(r.emitted.size()) != r.accepted + 1 || r.p < 0)
    return Status::InvalidArgument(label, "inconsistent window record (T, draft, accepted, emitted disagree)");
  return r;
}

Result<std::vector<WindowRecord>> ReadWindowRecords(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{1} << 30));
  std::vector<WindowRecord> out;
  std::size_t start = 0, line_no = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    std::string_view line(text.data() + start, end - start);
    if (!line.empty()) {
      LOCKSTEP_ASSIGN_OR_RETURN(WindowRecord r, WindowRecord::FromJsonLine(line, path + ":" + std::to_string(line_no)));
      if (r.idx != static_cast<int>(out.size()))
        return Status::InvalidArgument(path + ":" + std::to_string(line_no),
                                       "window idx " + std::to_string(r.idx) + " out of order (expected " +
                                           std::to_string(out.size()) + ")");
      out.push_back(std::move(r));
    }
    start = end + 1;
  }
  return out;
}

}  // namespace lockstep
