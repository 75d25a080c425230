// Localize: the walk over two exports' op records (localize.h). Reports: localize_report.cpp.
#include "lockstep/compare/localize.h"

#include <bit>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>

namespace lockstep {

namespace {

// One export's records with their op names resolved.
struct Side {
  const ExportMeta& m;
  std::vector<std::string_view> names;  // per record
  explicit Side(const ExportMeta& meta) : m(meta) {
    names.reserve(m.op_records.size());
    for (const ExportOpRecord& r : m.op_records)
      names.push_back(r.op >= 0 && static_cast<std::size_t>(r.op) < m.op_table.size()
                          ? std::string_view(m.op_table[static_cast<std::size_t>(r.op)].name)
                          : std::string_view("?"));
  }
  std::size_t size() const { return names.size(); }
  const ExportOpRecord& rec(std::size_t i) const { return m.op_records[i]; }
  const ExportOpName* def(std::size_t i) const {
    const int op = m.op_records[i].op;
    return op >= 0 && static_cast<std::size_t>(op) < m.op_table.size()
               ? &m.op_table[static_cast<std::size_t>(op)]
               : nullptr;
  }
};

bool SameKey(const Side& a, std::size_t i, const Side& b, std::size_t j) {
  const ExportOpRecord &x = a.rec(i), &y = b.rec(j);
  return x.window == y.window && x.stage == y.stage && x.layer == y.layer && x.index == y.index &&
         x.position == y.position && x.row == y.row && a.names[i] == b.names[j];
}

OpSite SiteOf(const Side& a, std::size_t i, const Side* b, std::size_t j) {
  const ExportOpRecord& r = a.rec(i);
  OpSite s;
  s.window = r.window, s.stage = r.stage, s.layer = r.layer, s.index = r.index;
  s.position = r.position, s.row = r.row;
  s.op = std::string(a.names[i]);
  s.digest_a = r.digest, s.l2_a = r.l2;
  if (b != nullptr && j < b->size()) s.digest_b = b->rec(j).digest, s.l2_b = b->rec(j).l2;
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t b = 0;
  while (b <= s.size()) {
    std::size_t e = s.find(sep, b);
    if (e == std::string_view::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// The most recent record before i in i's window that `input` names (op_table.h's rule), or -1.
std::int64_t Resolve(const Side& a, std::size_t i, std::string_view input) {
  const ExportOpRecord& r = a.rec(i);
  const bool state = input.rfind("state:", 0) == 0;
  const std::vector<std::string_view> alts = Split(state ? input.substr(6) : input, '|');
  for (std::size_t k = i; k-- > 0;) {
    const ExportOpRecord& q = a.rec(k);
    if (q.window != r.window) break;
    bool named = false;
    for (std::string_view n : alts) named = named || a.names[k] == n;
    if (!named) continue;
    if (state ? (q.row == -1 && q.stage == r.stage && q.layer == r.layer)
              : (q.row != -1 && q.position == r.position))
      return static_cast<std::int64_t>(k);
  }
  return -1;
}

// Rows of one op (a run of records of the same op, stage and layer) in both runs: the divergence
// of their values (dumps) or of their norms.
struct Acc {
  double diff2 = 0.0, ref2 = 0.0;
  double value() const { return ref2 > 0.0 ? std::sqrt(diff2 / ref2) : (diff2 > 0.0 ? 1.0 : 0.0); }
};

void AddRow(const ExportMeta& ma, const ExportOpRecord& x, const ExportMeta& mb,
            const ExportOpRecord& y, bool dumps, Acc* acc) {
  if (dumps && x.dump_offset >= 0 && y.dump_offset >= 0 && x.dump_len == y.dump_len) {
    for (std::int64_t e = 0; e < x.dump_len; ++e) {
      const double va = ma.op_dump[static_cast<std::size_t>(x.dump_offset + e)];
      const double vb = mb.op_dump[static_cast<std::size_t>(y.dump_offset + e)];
      acc->diff2 += (va - vb) * (va - vb);
      acc->ref2 += va * va;
    }
    return;
  }
  if (x.l2 < 0 || y.l2 < 0) return;
  acc->diff2 += (x.l2 - y.l2) * (x.l2 - y.l2);
  acc->ref2 += x.l2 * x.l2;
}

// Per layer of window w: the residual's divergence minus the layer input's.
void LayerTable(const Side& a, const Side& b, int w, LocalizeResult* out) {
  using K = std::tuple<int, int, int, std::string_view, int, int, int>;
  std::map<K, std::size_t> in_b;
  bool dumps = !a.m.op_dump.empty() && !b.m.op_dump.empty();
  for (std::size_t j = 0; j < b.size(); ++j) {
    const ExportOpRecord& y = b.rec(j);
    if (y.window == w)
      in_b.emplace(K{y.window, y.stage, y.layer, b.names[j], y.index, y.position, y.row}, j);
  }
  out->divergence_metric = dumps ? "nrmse (dumps)" : "l2-norm relative difference";
  double last_in = 0.0;
  std::map<std::pair<int, int>, double> pending;  // (stage, layer) -> its input's divergence
  std::size_t i = 0;
  while (i < a.size()) {
    if (a.rec(i).window != w) {
      ++i;
      continue;
    }
    const std::size_t begin = i;
    const ExportOpRecord& x0 = a.rec(i);
    const std::string_view name = a.names[i];
    Acc acc;
    for (; i < a.size() && a.rec(i).window == w && a.names[i] == name &&
           a.rec(i).layer == x0.layer && a.rec(i).stage == x0.stage;
         ++i) {
      const ExportOpRecord& x = a.rec(i);
      auto it = in_b.find(K{x.window, x.stage, x.layer, name, x.index, x.position, x.row});
      if (it != in_b.end()) AddRow(a.m, x, b.m, b.rec(it->second), dumps, &acc);
    }
    (void)begin;
    const double d = acc.value();
    if (name == "attn_norm") pending[{x0.stage, x0.layer}] = last_in;
    if (name == "residual") {
      LayerDivergence ld;
      ld.stage = x0.stage, ld.layer = x0.layer;
      auto p = pending.find({x0.stage, x0.layer});
      ld.in = p != pending.end() ? p->second : last_in;
      ld.out = d;
      ld.added = ld.out - ld.in;
      out->layers.push_back(ld);
    }
    if (name == "embed" || name == "residual" || name == "mtp_fc") last_in = d;
  }
}

// The --inject of `m` that fired on (item, layer), if any: its text.
std::string InjectionOn(const ExportMeta& m, std::string_view item, int layer) {
  for (const std::string& s : m.injections) {
    const nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
    if (!j.is_object() || j.value("kind", "") != "perturb" || !j.value("fired", false)) continue;
    if (j.value("item", "") != item) continue;
    if (j.contains("layer") && j["layer"].is_number_integer() && j["layer"].get<int>() != layer)
      continue;
    return j.value("text", "");
  }
  return "";
}

void StepOf(const ExportMeta& m, int w, int* rows, int* seqs) {
  for (const WindowRecord& r : m.windows)
    if (r.idx == w && r.step >= 0) {
      *rows = r.step_rows;
      *seqs = r.step_seqs;
    }
}

}  // namespace

const char* LocalizeVerdictName(LocalizeVerdict v) {
  switch (v) {
    case LocalizeVerdict::kNoDifference:
      return "no_difference";
    case LocalizeVerdict::kBorn:
      return "born";
    case LocalizeVerdict::kCarried:
      return "carried";
    case LocalizeVerdict::kPath:
      return "path";
    case LocalizeVerdict::kNothing:
      return "nothing_comparable";
  }
  return "?";
}

int LocalizeExitCode(const LocalizeResult& r) {
  if (r.verdict == LocalizeVerdict::kNothing) return 2;
  if (r.verdict == LocalizeVerdict::kNoDifference) return r.compared > 0 ? 0 : 2;
  return 1;
}

LocalizeResult Localize(const ExportMeta& ma, const ExportMeta& mb) {
  LocalizeResult out;
  const Side a(ma), b(mb);
  out.records_a = static_cast<std::int64_t>(a.size());
  out.records_b = static_cast<std::int64_t>(b.size());
  if (a.size() == 0 || b.size() == 0) {
    out.verdict = LocalizeVerdict::kNothing;
    out.why = std::string(a.size() == 0 && b.size() == 0 ? "neither export holds"
                          : a.size() == 0                ? "export A holds no"
                                                         : "export B holds no") +
              " op records (/ops): rerun both with --op-digests WINDOWS, or use localize --rerun";
    return out;
  }
  const std::size_t n = std::min(a.size(), b.size());
  std::size_t i = 0;
  for (; i < n; ++i) {
    if (!SameKey(a, i, b, i)) break;
    if (a.rec(i).digest != b.rec(i).digest) break;
  }
  out.compared = static_cast<std::int64_t>(i < n ? i + 1 : n);
  if (i == n && a.size() == b.size()) {
    out.verdict = LocalizeVerdict::kNoDifference;
    out.kind = "no difference";
    out.why = std::to_string(n) + " op records compared, every one bitwise equal";
    return out;
  }
  const bool path = i == n || !SameKey(a, i, b, i);
  if (path) {
    out.verdict = LocalizeVerdict::kPath;
    out.kind = "path";
    out.compared = static_cast<std::int64_t>(i);
    if (i < a.size()) out.first = SiteOf(a, i, nullptr, 0);
    if (i < b.size()) out.first_b = SiteOf(b, i, nullptr, 0);
    out.why = "the runs' op sequences part after " + std::to_string(i) +
              " equal records: they ran different ops or rows (a different draft, window size or "
              "stop) with every op output before bitwise equal, so no op's arithmetic differs "
              "first: a path difference (a timing- or policy-dependent knob)";
  } else {
    out.first = SiteOf(a, i, &b, i);
    const ExportOpName* def = a.def(i);
    if (a.rec(i).row == -1) {
      out.verdict = LocalizeVerdict::kCarried;
      out.kind = "carried";
      out.item = "stage" + std::to_string(a.rec(i).stage) + "/layer" +
                 std::to_string(a.rec(i).layer) + "/" + out.first.op;
      for (std::size_t k = i; k-- > 0;) {
        const ExportOpRecord& q = a.rec(k);
        if (q.row == -1 && q.stage == a.rec(i).stage && q.layer == a.rec(i).layer &&
            a.names[k] == a.names[i]) {
          out.origin_window_equal = q.window;
          break;
        }
      }
      out.origin_injection = InjectionOn(mb, out.first.op, a.rec(i).layer);
      if (out.origin_injection.empty())
        out.origin_injection = InjectionOn(ma, out.first.op, a.rec(i).layer);
      out.why = "born in no op: the first record that differs is the state item " + out.item +
                " as window " + std::to_string(out.first.window) +
                " reads it, with every op output before it equal";
    } else if (def != nullptr && def->inputs.empty()) {
      out.verdict = LocalizeVerdict::kPath;
      out.kind = "path";
      out.why = "the first record that differs is " + out.first.op +
                ", which reads no op: the tokens the window consumes differ";
    } else {
      out.verdict = LocalizeVerdict::kBorn;
      if (def != nullptr)
        for (const std::string& in : def->inputs) {
          LocalizeInput li;
          li.name = in;
          const std::int64_t k = Resolve(a, i, in);
          li.recorded = k >= 0;
          if (li.recorded)
            li.site = SiteOf(a, static_cast<std::size_t>(k), &b, static_cast<std::size_t>(k));
          else
            out.inputs_unrecorded.push_back(in);
          out.inputs.push_back(std::move(li));
        }
      out.kind = out.inputs_unrecorded.empty() ? "same inputs, different output"
                                               : "different output; inputs not recorded";
      out.why = out.inputs_unrecorded.empty()
                    ? "every input it reads is bitwise equal (earlier records), its output is not"
                    : "its output differs; some inputs have no record (windows outside "
                      "--op-digests?), so equal inputs are not shown";
    }
    const ExportOpRecord &x = a.rec(i), &y = b.rec(i);
    if (x.dump_offset >= 0 && y.dump_offset >= 0 && x.dump_len == y.dump_len) {
      out.has_dump = true;
      double d2 = 0, r2 = 0;
      for (std::int64_t e = 0; e < x.dump_len; ++e) {
        const double va = ma.op_dump[static_cast<std::size_t>(x.dump_offset + e)];
        const double vb = mb.op_dump[static_cast<std::size_t>(y.dump_offset + e)];
        const bool same = std::bit_cast<std::uint32_t>(static_cast<float>(va)) ==
                          std::bit_cast<std::uint32_t>(static_cast<float>(vb));
        if (!same && out.first_element < 0) {
          out.first_element = e;
          out.element_a = va, out.element_b = vb;
        }
        d2 += (va - vb) * (va - vb);
        r2 += va * va;
        out.max_abs = std::max(out.max_abs, std::fabs(va - vb));
      }
      out.nrmse = r2 > 0 ? std::sqrt(d2 / r2) : (d2 > 0 ? 1.0 : 0.0);
    }
  }
  const int w = out.first.window;
  StepOf(ma, w, &out.step_rows_a, &out.step_seqs_a);
  StepOf(mb, w, &out.step_rows_b, &out.step_seqs_b);
  if (out.verdict != LocalizeVerdict::kPath) LayerTable(a, b, w, &out);
  return out;
}

}  // namespace lockstep
