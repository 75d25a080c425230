#include "lockstep/engine/inject.h"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "lockstep/engine/op_table.h"

namespace lockstep {

namespace {

Result<double> Number(std::string_view v, const std::string& text) {
  double d = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(d) || d < 0)
    return Status::InvalidArgument("--inject '" + text + "'",
                                   "'" + std::string(v) + "' is not a non-negative number");
  return d;
}

// One "key=value" field of an injection spec: the one after `colon` in `s`, both advanced past it
// (colon is npos after the last field). kInvalidArgument when the field has no '='.
struct KeyValue {
  std::string_view key, val;
};
Result<KeyValue> NextField(std::string_view& s, std::size_t& colon, const std::string& text) {
  s = s.substr(colon + 1);
  colon = s.find(':');
  const std::string_view kv = s.substr(0, colon);
  const auto eq = kv.find('=');
  if (eq == std::string_view::npos)
    return Status::InvalidArgument("--inject '" + text + "'",
                                   "expected key=value, got '" + std::string(kv) + "'");
  return KeyValue{kv.substr(0, eq), kv.substr(eq + 1)};
}

// perturb-op:stage=S:layer=L:op=NAME:window=W:row=R:ulps=K (every key required but stage, which
// defaults to the layer's; layer -1 = a stage op such as final_norm or lm_head).
Status ParsePerturbOp(std::string_view s, std::size_t colon, const std::string& text,
                      Injection* inj) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--inject '" + text + "'", why);
  };
  bool have_layer = false, have_op = false, have_window = false, have_row = false,
       have_ulps = false;
  while (colon != std::string_view::npos) {
    LOCKSTEP_ASSIGN_OR_RETURN(const KeyValue field, NextField(s, colon, text));
    const std::string_view key = field.key, val = field.val;
    if (key == "op") {
      if (FindOpDef(val) == nullptr || FindOpDef(val)->state) {
        std::string names;
        for (const OpDef& d : OpTable())
          if (!d.state) names += (names.empty() ? "" : ", ") + std::string(d.name);
        return bad("unknown op '" + std::string(val) + "' (expected one of " + names + ")");
      }
      inj->op = std::string(val);
      have_op = true;
      continue;
    }
    if (key == "layer" && val == "-1") {
      inj->layer = -1;
      have_layer = true;
      continue;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(double d, Number(val, text));
    if (d > 1e9 || d != static_cast<double>(static_cast<std::int64_t>(d)))
      return bad("'" + std::string(val) + "' is not an integer in range");
    const int v = static_cast<int>(d);
    if (key == "stage") {
      inj->stage = v;
    } else if (key == "layer") {
      inj->layer = v, have_layer = true;
    } else if (key == "window") {
      inj->window = v, have_window = true;
    } else if (key == "row") {
      inj->row = v, have_row = true;
    } else if (key == "ulps") {
      inj->ulps = v, have_ulps = true;
    } else {
      return bad("unknown key '" + std::string(key) +
                 "' (expected stage, layer, op, window, row, ulps)");
    }
  }
  if (!have_op || !have_layer || !have_window || !have_row || !have_ulps)
    return bad("perturb-op needs layer=L, op=NAME, window=W, row=R and ulps=K");
  if (inj->ulps == 0) return bad("ulps=0 changes nothing");
  return Status::Ok();
}

}  // namespace

Result<std::vector<Injection>> ParseInjections(const std::vector<std::string>& specs) {
  std::vector<Injection> out;
  for (const auto& text : specs) {
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("--inject '" + text + "'", why);
    };
    std::string_view s = text;
    auto colon = s.find(':');
    std::string_view kind = s.substr(0, colon);
    Injection inj;
    inj.text = text;
    if (kind == "delay") {
      inj.kind = Injection::Kind::kDelay;
    } else if (kind == "perturb") {
      inj.kind = Injection::Kind::kPerturb;
    } else if (kind == "perturb-op") {
      inj.kind = Injection::Kind::kPerturbOp;
    } else {
      return bad("unknown kind '" + std::string(kind) +
                 "' (expected delay, perturb or perturb-op)");
    }
    if (inj.kind == Injection::Kind::kPerturbOp) {
      LOCKSTEP_RETURN_IF_ERROR(ParsePerturbOp(s, colon, text, &inj));
      out.push_back(inj);
      continue;
    }
    const bool perturb = inj.kind == Injection::Kind::kPerturb;
    bool have_ms = false, have_eps = false, have_item = false;
    while (colon != std::string_view::npos) {
      LOCKSTEP_ASSIGN_OR_RETURN(const KeyValue field, NextField(s, colon, text));
      const std::string_view key = field.key, val = field.val;
      if (perturb && key == "item") {
        const std::optional<ItemKind> item = ParseItemKind(val);
        if (!item || !IsPerturbable(*item)) {
          std::string names;
          for (ItemKind k : AllItemKinds())
            if (IsPerturbable(k))
              names += (names.empty() ? "" : ", ") + std::string(ItemKindName(k));
          return bad("unknown item '" + std::string(val) + "' (expected " + names + ")");
        }
        inj.item = *item;
        have_item = true;
        continue;
      }
      LOCKSTEP_ASSIGN_OR_RETURN(double d, Number(val, text));
      if (d > 1e9) return bad("'" + std::string(val) + "' is out of range");
      if (perturb && key == "layer") {
        inj.layer = static_cast<int>(d);
      } else if (perturb && key == "eps") {
        inj.eps = d;
        have_eps = true;
      } else if (key == "stage") {
        inj.stage = static_cast<int>(d);
      } else if (key == "window") {
        inj.window = static_cast<int>(d);
      } else if (!perturb && key == "ms") {
        inj.ms = d;
        have_ms = true;
      } else {
        return bad("unknown key '" + std::string(key) + "' (expected " +
                   (perturb ? "stage, layer, item, eps, window" : "stage, window, ms") + ")");
      }
    }
    if (!perturb && !have_ms) return bad("a delay needs ms=M");
    if (perturb) {
      if (!have_item) return bad("a perturbation needs item=I");
      if (!have_eps) return bad("a perturbation needs eps=E");
      const std::string name = ItemKindName(inj.item);
      if (IsLayerItem(inj.item) && inj.layer < 0) return bad("item " + name + " needs layer=L");
      if (!IsLayerItem(inj.item) && inj.layer >= 0) return bad("item " + name + " takes no layer");
    }
    out.push_back(inj);
  }
  return out;
}

std::string InjectionRecordJson(const Injection& inj, const InjectionRecord& rec) {
  using nlohmann::json;
  const bool perturb = inj.kind == Injection::Kind::kPerturb;
  const bool op = inj.kind == Injection::Kind::kPerturbOp;
  auto any = [](int v) { return v < 0 ? json(nullptr) : json(v); };
  json j;
  j["text"] = inj.text;
  j["kind"] = op ? "perturb-op" : perturb ? "perturb" : "delay";
  if (op) {
    j["op"] = inj.op;
    j["layer"] = any(inj.layer);
    j["row"] = inj.row;
    j["ulps"] = inj.ulps;
  } else if (perturb) {
    j["item"] = ItemKindName(inj.item);
    j["eps"] = inj.eps;
    j["layer"] = any(inj.layer);
  } else {
    j["ms"] = inj.ms;
  }
  j["stage"] = any(inj.stage);
  j["window"] = any(inj.window);
  j["fired"] = rec.count > 0;
  j["count"] = rec.count;
  json fs = json::array();
  for (const InjectionFiring& f : rec.firings) {
    json fj{{"window", f.window}, {"stage", f.stage}, {"p", f.p}, {"T", f.T}};
    if (op) {
      fj["op"] = inj.op;
      if (f.layer >= 0) fj["layer"] = f.layer;
      fj["row"] = f.row;
      fj["position"] = f.position;
      fj["element"] = f.element;
      fj["ulps"] = inj.ulps;
    } else if (perturb) {
      fj["factor"] = f.factor;
      if (f.layer >= 0) fj["layer"] = f.layer;
      fj["item"] = ItemKindName(inj.item);
    } else {
      fj["ms"] = f.ms;
    }
    fs.push_back(std::move(fj));
  }
  j["firings"] = std::move(fs);
  if (rec.count > static_cast<std::int64_t>(rec.firings.size())) j["firings_truncated"] = true;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Status CheckInjectionsFired(const std::vector<Injection>& inj,
                            const std::vector<InjectionRecord>& records, int windows,
                            const std::string& stop_reason) {
  std::string unfired;
  for (std::size_t i = 0; i < inj.size(); ++i)
    if (i >= records.size() || records[i].count == 0)
      unfired += (unfired.empty() ? "'" : ", '") + inj[i].text + "'";
  if (unfired.empty()) return Status::Ok();
  return Status::InvalidArgument(
      "--inject " + unfired,
      "never fired: the request ran " +
          (windows > 0 ? std::to_string(windows) + " verify windows (0.." +
                             std::to_string(windows - 1) + ")"
                       : std::string("no verify window")) +
          " and stopped (" + stop_reason +
          ") before the injection applied; its record (fired: false) is in the outputs");
}

}  // namespace lockstep
