// State transplant (graft.h): the engine's side. The values come from the harness (FROM's rows,
// already checked against FROM); here they are checked against this engine and installed at the
// checkpoint the generation loop reaches.
#include "lockstep/engine/graft.h"

#include <nlohmann/json.hpp>

#include "lockstep/engine/engine.h"

namespace lockstep {

namespace {

std::string Dims(const std::vector<std::int64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

Status StageSession::Graft(const lockstep::Graft& g) {
  return Status::NotSupported("--graft '" + g.text + "'",
                              "this backend keeps its state on the device; grafts need the cpu "
                              "backend");
}

Status Engine::CheckGraft(const Graft& g) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--graft '" + g.text + "'", why);
  };
  if (!IsGraftable(g.item))
    return bad(std::string("item kind ") + ItemKindName(g.item) +
               " is not state (graftable: k, v, conv_state, ssm_state, mtp k / v)");
  if (g.stage < 0 || g.stage >= n_stages())
    return bad("stage " + std::to_string(g.stage) + " does not exist here (" +
               std::to_string(n_stages()) + " stages)");
  if (g.window < 0 || g.window >= cfg_.max_new)
    return bad("window " + std::to_string(g.window) + " never runs: max_new " +
               std::to_string(cfg_.max_new));
  StageSession& st = stage(g.stage);
  const bool mtp = g.item == ItemKind::kMtpK || g.item == ItemKind::kMtpV;
  const bool gdn_item = g.item == ItemKind::kConvState || g.item == ItemKind::kSsmState;
  if (!mtp && (g.layer < st.layer_begin() || g.layer >= st.layer_end()))
    return bad("layer " + std::to_string(g.layer) + " is not on stage " + std::to_string(g.stage) +
               " here");
  std::vector<std::int64_t> want;
  DType dtype = DType::kF32;
  if (gdn_item) {
    GdnState* s = st.gdn(g.layer);
    if (s == nullptr) return bad("layer " + std::to_string(g.layer) + " has no recurrent state");
    const ModelConfig& c = w_.config;
    want = g.item == ItemKind::kConvState
               ? std::vector<std::int64_t>{s->conv_rows(), s->conv_dim()}
               : std::vector<std::int64_t>{c.n_v_heads, c.k_head_dim, c.v_head_dim};
  } else {
    KvCache* kv = mtp ? st.mtp_kv() : st.kv(g.layer);
    if (kv == nullptr)
      return bad(mtp ? "stage " + std::to_string(g.stage) + " has no MTP draft K/V"
                     : "layer " + std::to_string(g.layer) + " has no K/V (a GDN layer)");
    want = {g.rows, kv->n_heads_kv(), kv->head_dim()};
    dtype = kv->dtype();
  }
  if (g.shape != want || g.dtype != dtype)
    return bad("shape/dtype mismatch: FROM holds " + std::string(dtype_name(g.dtype)) + " " +
               Dims(g.shape) + ", this run's item is " + std::string(dtype_name(dtype)) + " " +
               Dims(want));
  return Status::Ok();
}

Status Engine::SetGrafts(std::vector<Graft> grafts) {
  for (const Graft& g : grafts) LOCKSTEP_RETURN_IF_ERROR(CheckGraft(g));
  if (!grafts.empty() && backend_->name() != "cpu")
    return Status::NotSupported(
        "--graft", "the " + backend_->name() + " backend cannot take a grafted state (cpu only)");
  Slot& sl = cur();
  sl.graft_records.assign(grafts.size(), GraftRecord{});
  sl.grafts = std::move(grafts);
  return Status::Ok();
}

Status Engine::ApplyGrafts(int window, CheckpointPoint point) {
  Slot& sl = cur();
  for (std::size_t i = 0; i < sl.grafts.size(); ++i) {
    const Graft& g = sl.grafts[i];
    if (g.window != window || g.point != point) continue;
    LOCKSTEP_RETURN_IF_ERROR(stage(g.stage).Graft(g));
    GraftRecord& rec = sl.graft_records[i];
    ++rec.count;
    rec.firings.push_back(GraftFiring{window, g.stage, g.layer, point, g.rows});
  }
  return Status::Ok();
}

std::string GraftRecordJson(const Graft& g, const GraftRecord& rec) {
  using nlohmann::json;
  json j;
  j["text"] = g.text;
  j["kind"] = "graft";
  j["from"] = g.from;
  j["item"] = g.rel;
  j["stage"] = g.stage;
  j["layer"] = g.layer < 0 ? json(nullptr) : json(g.layer);
  j["window"] = g.window;
  j["point"] = CheckpointPointName(g.point);
  j["fired"] = rec.count > 0;
  j["count"] = rec.count;
  json fs = json::array();
  for (const GraftFiring& f : rec.firings)
    fs.push_back({{"window", f.window},
                  {"stage", f.stage},
                  {"point", CheckpointPointName(f.point)},
                  {"rows", f.rows}});
  j["firings"] = std::move(fs);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Status CheckGraftsFired(const std::vector<Graft>& grafts, const std::vector<GraftRecord>& records,
                        int windows, const std::string& stop_reason) {
  std::string unfired;
  for (std::size_t i = 0; i < grafts.size(); ++i)
    if (i >= records.size() || records[i].count == 0)
      unfired += (unfired.empty() ? "'" : ", '") + grafts[i].text + "'";
  if (unfired.empty()) return Status::Ok();
  return Status::InvalidArgument("--graft " + unfired,
                                 "never fired: the request ran " + std::to_string(windows) +
                                     " verify windows and stopped (" + stop_reason +
                                     ") before that checkpoint; its record (fired: false) is in "
                                     "the outputs");
}

}  // namespace lockstep
