#include "lockstep/engine/window.h"

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "lockstep/engine/atomic_file.h"

namespace lockstep {
namespace {

// nlohmann's get<int>() static_casts whatever number it holds: a float out of the target's range
// is undefined behaviour and a too-large integer silently wraps (p = 2^32 read as 0). Integer
// fields are therefore range-checked here; the throw is turned into a Status by FromJsonLine.
template <typename Int>
Int CheckedInt(const nlohmann::json& v, const char* key) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u <= static_cast<std::uint64_t>(std::numeric_limits<Int>::max()))
      return static_cast<Int>(u);
  } else if (v.is_number_integer()) {
    const auto s = v.get<std::int64_t>();
    if (s >= std::numeric_limits<Int>::min() && s <= std::numeric_limits<Int>::max())
      return static_cast<Int>(s);
  } else {
    throw std::invalid_argument(std::string("'") + key + "': expected an integer, got " + v.dump());
  }
  throw std::out_of_range(std::string("'") + key + "': " + v.dump() + " is out of range");
}

template <typename Int>
std::vector<Int> CheckedIntArray(const nlohmann::json& v, const char* key) {
  if (!v.is_array())
    throw std::invalid_argument(std::string("'") + key + "': expected an array of integers");
  std::vector<Int> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(CheckedInt<Int>(e, key));
  return out;
}

std::int64_t OptionalNs(const nlohmann::json& j, const char* key) {
  return j.contains(key) ? CheckedInt<std::int64_t>(j.at(key), key) : 0;
}

// A device timing of a stage: absent or null = not measured (-1, as StageTiming defaults);
// otherwise a non-negative integer.
std::int64_t DeviceNs(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return -1;
  const auto v = CheckedInt<std::int64_t>(j.at(key), key);
  if (v < 0)
    throw std::out_of_range(std::string("'") + key + "': negative (" + std::to_string(v) + ")");
  return v;
}

GraphUse ParseGraphUse(const nlohmann::json& j) {
  if (!j.contains("graph")) return GraphUse::kNone;
  const std::string g = j.at("graph").get<std::string>();
  for (GraphUse u : {GraphUse::kNone, GraphUse::kEager, GraphUse::kCapture, GraphUse::kReplay})
    if (g == GraphUseName(u)) return u;
  throw std::invalid_argument("'graph': unknown value \"" + g +
                              "\" (none, eager, capture, replay)");
}

// The per-stage records ToJsonLine writes; traces written before them have no "stages" key.
std::vector<StageTiming> ParseStages(const nlohmann::json& j) {
  std::vector<StageTiming> out;
  if (!j.contains("stages")) return out;
  const nlohmann::json& a = j.at("stages");
  if (!a.is_array()) throw std::invalid_argument("'stages': expected an array of objects");
  for (const auto& o : a) {
    if (!o.is_object()) throw std::invalid_argument("'stages': expected an array of objects");
    StageTiming st;
    st.wait_ns = OptionalNs(o, "wait_ns");
    st.compute_ns = OptionalNs(o, "compute_ns");
    st.cpu_ns = OptionalNs(o, "cpu_ns");
    st.dev_wait_ns = DeviceNs(o, "dev_wait_ns");
    st.dev_compute_ns = DeviceNs(o, "dev_compute_ns");
    st.dev_copy_ns = DeviceNs(o, "dev_copy_ns");
    st.init_ns = DeviceNs(o, "init_ns");
    st.graph = ParseGraphUse(o);
    out.push_back(st);
  }
  return out;
}

template <auto M>
std::int64_t Get(const WindowRecord& w) {
  return static_cast<std::int64_t>(w.*M);
}
template <auto M>
void Set(WindowRecord& w, std::int64_t v) {
  w.*M = static_cast<std::remove_reference_t<decltype(w.*M)>>(v);
}

using K = WindowFieldKind;
using R = WindowFieldRole;
#define LOCKSTEP_SCALAR_(name, kind, role, optional, nullable)          \
  WindowField {                                                         \
#name, kind, role, optional, nullable, &Get < &WindowRecord::name>, \
        &Set < &WindowRecord::name>, nullptr                            \
  }
#define LOCKSTEP_TOKENS_(name) \
  WindowField { #name, K::kTokens, R::kPath, false, false, nullptr, nullptr, &WindowRecord::name }
const WindowField kWindowFields[] = {
    LOCKSTEP_SCALAR_(idx, K::kInt, R::kIndex, false, false),
    LOCKSTEP_SCALAR_(p, K::kInt, R::kPath, false, false),
    LOCKSTEP_SCALAR_(T, K::kInt, R::kPath, false, false),
    LOCKSTEP_SCALAR_(T_mtp, K::kInt, R::kPath, false, false),
    LOCKSTEP_SCALAR_(merged, K::kBool, R::kPath, false, false),
    LOCKSTEP_SCALAR_(from_sfx, K::kBool, R::kPath, false, false),
    LOCKSTEP_SCALAR_(chain_n, K::kInt, R::kPath, false, false),
    LOCKSTEP_SCALAR_(accepted, K::kInt, R::kPath, false, false),
    LOCKSTEP_SCALAR_(source, K::kSource, R::kPath, false, false),
    LOCKSTEP_TOKENS_(draft),
    LOCKSTEP_TOKENS_(emitted),
    LOCKSTEP_SCALAR_(begin_ns, K::kNs, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(end_ns, K::kNs, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(draft_ns, K::kNs, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(verify_ns, K::kNs, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(wait_ns, K::kNs, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(compute_ns, K::kNs, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(commit_ns, K::kNs, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(export_ns, K::kNs, R::kTiming, true, true),  // -1 = no observer
    LOCKSTEP_SCALAR_(first_call, K::kBool, R::kTiming, true, false),
    LOCKSTEP_SCALAR_(step, K::kNs, R::kContext, true, true),  // -1 = unknown (older records)
    LOCKSTEP_SCALAR_(step_rows, K::kInt, R::kContext, true, false),
    LOCKSTEP_SCALAR_(step_seqs, K::kInt, R::kContext, true, false),
    LOCKSTEP_SCALAR_(step_prefill_rows, K::kInt, R::kContext, true, false),
};
#undef LOCKSTEP_SCALAR_
#undef LOCKSTEP_TOKENS_

// One field of `j` into `r` (throws on a bad value; FromJsonLine turns that into a Status).
Status ReadJsonField(const nlohmann::json& j, const WindowField& f, WindowRecord& r) {
  if (f.nullable) {  // unknown (-1) unless a number
    const bool known = j.contains(f.name) && j[f.name].is_number();
    f.set(r, known ? CheckedInt<std::int64_t>(j[f.name], f.name) : -1);
    return Status::Ok();
  }
  if (f.optional && !j.contains(f.name)) {
    if (f.kind != K::kTokens) f.set(r, 0);
    return Status::Ok();
  }
  const nlohmann::json& v = j.at(f.name);
  switch (f.kind) {
    case K::kInt:
      f.set(r, CheckedInt<int>(v, f.name));
      break;
    case K::kBool:
      f.set(r, v.get<bool>() ? 1 : 0);
      break;
    case K::kSource: {
      LOCKSTEP_ASSIGN_OR_RETURN(DraftSource d, ParseDraftSource(v.get<std::string>()));
      f.set(r, static_cast<std::int64_t>(d));
      break;
    }
    case K::kTokens:
      r.*f.tokens = CheckedIntArray<std::int32_t>(v, f.name);
      break;
    case K::kNs:
      f.set(r, CheckedInt<std::int64_t>(v, f.name));
      break;
  }
  return Status::Ok();
}

}  // namespace

const std::vector<WindowField>& WindowFields() {
  static const std::vector<WindowField> kFields(std::begin(kWindowFields), std::end(kWindowFields));
  return kFields;
}

const WindowField* FindWindowField(std::string_view name) {
  for (const WindowField& f : WindowFields())
    if (name == f.name) return &f;
  return nullptr;
}

const char* GraphUseName(GraphUse g) {
  switch (g) {
    case GraphUse::kNone:
      return "none";
    case GraphUse::kEager:
      return "eager";
    case GraphUse::kCapture:
      return "capture";
    case GraphUse::kReplay:
      return "replay";
  }
  return "none";
}

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
  for (DraftSource d :
       {DraftSource::kNone, DraftSource::kMtp, DraftSource::kSuffix, DraftSource::kMerged})
    if (s == DraftSourceName(d)) return d;
  return Status::InvalidArgument(
      "draft source", "unknown '" + std::string(s) + "' (expected none, mtp, suffix or merged)");
}

bool WindowRecord::SamePath(const WindowRecord& o) const {
  for (const WindowField& f : kWindowFields) {
    if (f.role == WindowFieldRole::kTiming || f.role == WindowFieldRole::kContext) continue;
    const bool same = f.kind == WindowFieldKind::kTokens ? this->*f.tokens == o.*f.tokens
                                                         : f.get(*this) == f.get(o);
    if (!same) return false;
  }
  return true;
}

std::string WindowRecord::ToJsonLine() const {
  nlohmann::ordered_json j;
  j["schema"] = "lockstep.window";
  j["v"] = 1;
  for (const WindowField& f : kWindowFields) {
    switch (f.kind) {
      case WindowFieldKind::kInt:
        j[f.name] = static_cast<int>(f.get(*this));
        break;
      case WindowFieldKind::kBool:
        j[f.name] = f.get(*this) != 0;
        break;
      case WindowFieldKind::kSource:
        j[f.name] = DraftSourceName(source);
        break;
      case WindowFieldKind::kTokens:
        j[f.name] = this->*f.tokens;
        break;
      case WindowFieldKind::kNs:
        if (f.nullable && f.get(*this) < 0) {
          j[f.name] = nullptr;  // unknown, never zero
        } else {
          j[f.name] = f.get(*this);
        }
        break;
    }
  }
  nlohmann::json st = nlohmann::json::array();
  for (const auto& s : stages) {
    nlohmann::json o = {{"wait_ns", s.wait_ns}, {"compute_ns", s.compute_ns}, {"cpu_ns", s.cpu_ns}};
    // Device timings exist only on device backends; absent keys mean "not measured" (and read
    // back as -1, so a record survives ToJsonLine -> FromJsonLine unchanged).
    if (s.dev_wait_ns >= 0 || s.dev_compute_ns >= 0 || s.dev_copy_ns >= 0 || s.init_ns >= 0) {
      auto ns = [](std::int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
      o["dev_wait_ns"] = ns(s.dev_wait_ns);
      o["dev_compute_ns"] = ns(s.dev_compute_ns);
      o["dev_copy_ns"] = ns(s.dev_copy_ns);
      o["init_ns"] = ns(s.init_ns);
    }
    if (s.graph != GraphUse::kNone) o["graph"] = GraphUseName(s.graph);
    st.push_back(o);
  }
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
      return Status::InvalidArgument(
          label, "not a lockstep.window record (missing \"schema\": \"lockstep.window\")");
    if (!j.contains("v") || j.at("v") != 1)
      return Status::InvalidArgument(label, "unsupported lockstep.window version");
    for (const WindowField& f : kWindowFields) LOCKSTEP_RETURN_IF_ERROR(ReadJsonField(j, f, r));
    r.stages = ParseStages(j);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(label, std::string("bad window record field: ") + e.what());
  }
  if (r.T < 1 || static_cast<int>(r.draft.size()) != r.T - 1 || r.accepted < 0 ||
      r.accepted > r.T - 1 || static_cast<int>(r.emitted.size()) != r.accepted + 1 || r.p < 0)
    return Status::InvalidArgument(
        label, "inconsistent window record (T, draft, accepted, emitted disagree)");
  return r;
}

Result<std::vector<WindowRecord>> ReadWindowRecords(const std::string& path,
                                                    std::string* torn_tail) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{1} << 30));
  std::vector<WindowRecord> out;
  std::size_t start = 0, line_no = 0;
  if (torn_tail != nullptr) torn_tail->clear();
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    ++line_no;
    std::string_view line(text.data() + start, end - start);
    if (!line.empty()) {
      const std::string label = path + ":" + std::to_string(line_no);
      Result<WindowRecord> parsed = WindowRecord::FromJsonLine(line, label);
      if (!parsed.ok() && !terminated) {
        // The writer emits a record and its newline in one write(), but a write that SIGKILL
        // interrupts can stop part-way (Linux checks for fatal signals between pages): an
        // unterminated last line that does not parse is that record, torn. The whole lines
        // before it stand; the tail is dropped and reported.
        if (torn_tail != nullptr)
          *torn_tail = label + ": " + std::to_string(line.size()) +
                       " bytes of an unfinished record (no newline)";
        break;
      }
      LOCKSTEP_ASSIGN_OR_RETURN(WindowRecord r, std::move(parsed));
      if (r.idx != static_cast<int>(out.size()))
        return Status::InvalidArgument(path + ":" + std::to_string(line_no),
                                       "window idx " + std::to_string(r.idx) +
                                           " out of order (expected " + std::to_string(out.size()) +
                                           ")");
      out.push_back(std::move(r));
    }
    start = end + 1;
  }
  return out;
}

}  // namespace lockstep
