// RenderJson: the machine-readable report (keys documented in compare/REPORTS.md). It may carry
// more than the Markdown (every item, every checkpoint), never prompt text; outside strings pass
// Redact().
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/compare/report.h"
#include "report_util.h"

namespace lockstep {
namespace {

using Json = nlohmann::ordered_json;  // keeps the documented key order (schema first)
using report_internal::ArmName;
using report_internal::ConfigDifferences;
using report_internal::FailureDetail;
using report_internal::HasMetric;
using report_internal::Redact;

// JSON has no inf/nan; nlohmann would write null, which reads as "unknown". Strings keep the value.
Json Num(double v) { return std::isfinite(v) ? Json(v) : Json(FormatMetric(v)); }
// -1 is the exports' "unknown" (STYLE 17): null in JSON, never a number.
Json Known(std::int64_t v) { return v < 0 ? Json(nullptr) : Json(v); }

// A hash prefix; empty (a trace carries none) is unknown: null.
Json Hash(const std::string& h) { return h.empty() ? Json(nullptr) : Json(h); }

Json VerdictJson(const VerdictBox& v) {
  return {{"status", v.status},
          {"label", v.label},
          {"reason", v.reason},
          {"compared", v.compared},
          {"details", v.details}};
}

// A window's scalar index and path fields (WindowFields(): idx, p, T, T_mtp, merged, from_sfx,
// chain_n, accepted, in that order), then its verify time.
Json WindowJson(const std::optional<WindowRecord>& w) {
  if (!w) return nullptr;
  Json j = Json::object();
  for (const WindowField& f : WindowFields()) {
    if (f.role != WindowFieldRole::kIndex && f.role != WindowFieldRole::kPath) continue;
    if (f.kind == WindowFieldKind::kInt) j[f.name] = f.get(*w);
    if (f.kind == WindowFieldKind::kBool) j[f.name] = f.get(*w) != 0;
  }
  j["verify_ms"] = w->verify_ns < 0 ? Json(nullptr) : Num(static_cast<double>(w->verify_ns) / 1e6);
  return j;
}

Json NotableJson(const std::vector<NotableWindow>& v) {
  Json arr = Json::array();
  for (const NotableWindow& n : v)
    arr.push_back({{"idx", n.idx},
                   {"p", n.p},
                   {"T", n.T},
                   {"verify_ms", Num(n.verify_ms)},
                   {"ratio_to_median", Num(n.ratio_to_median)},
                   {"after_divergence", n.after_divergence}});
  return arr;
}

Json ArmJson(const ArmInfo& a, const char* fallback) {
  Json config = Json::object();
  for (const auto& [k, v] : a.config) {
    Json parsed = Json::parse(v, nullptr, /*allow_exceptions=*/false);
    config[k] = parsed.is_discarded() ? Json(v) : parsed;
  }
  const SamplerSummary& s = a.sampler;
  Json sampler = {{"n_samples", s.n_samples},
                  {"interval_min_ns", Known(s.interval_min_ns)},
                  {"interval_median_ns", Known(s.interval_median_ns)},
                  {"interval_max_ns", Known(s.interval_max_ns)},
                  {"nvml", Redact(s.nvml)},
                  {"guard", Redact(s.guard)},
                  {"min_host_available_bytes", Known(s.min_host_available_bytes)},
                  {"max_swap_used_bytes", Known(s.max_swap_used_bytes)},
                  {"max_rss_bytes", Known(s.max_rss_bytes)},
                  {"n_device_samples", s.n_device_samples},
                  {"min_device_free_bytes", Known(s.min_device_free_bytes)},
                  {"max_temperature_c", Known(s.max_temperature_c)},
                  {"min_sm_clock_mhz", Known(s.min_sm_clock_mhz)},
                  {"max_sm_clock_mhz", Known(s.max_sm_clock_mhz)},
                  {"pcie_gen", Known(s.pcie_gen)},
                  {"pcie_width", Known(s.pcie_width)}};
  Json unknowns = Json::array();
  for (const std::string& u : a.unknowns) unknowns.push_back(Redact(u));
  return {{"arm", ArmName(a, fallback)},
          {"run_id", Redact(a.run_id)},
          {"has_export", a.has_export},
          {"model_sha256_12", Hash(a.model_sha256_12)},
          {"request_sha256_12", Hash(a.request_sha256_12)},
          {"config_sha256_12", Hash(a.config_sha256_12)},
          {"config", config},
          {"prompt_tokens", Known(a.prompt_tokens)},
          {"output_tokens", Known(a.output_tokens)},
          {"stop_reason", a.stop_reason.empty() ? Json(nullptr) : Json(Redact(a.stop_reason))},
          {"windows", Known(a.windows)},
          {"checkpoints", Known(a.checkpoints)},
          {"sampler", a.has_export ? sampler : Json(nullptr)},
          {"unknowns", unknowns}};
}

Json ItemJson(const ItemResult& it) {
  const bool m = HasMetric(it);
  const bool kl = m && it.has_kl;
  auto metric = [m](double v) { return m ? Num(v) : Json(nullptr); };
  return {{"checkpoint", it.checkpoint},
          {"rel", it.rel},
          {"kind", it.kind},
          {"stage", it.stage},
          {"layer", it.layer},
          {"dtype", it.dtype},
          {"label", it.label},
          {"verdict", VerdictName(it.verdict)},
          {"reason", Redact(it.reason)},
          {"rows", it.rows},
          {"capacity_rows", it.capacity_rows},
          {"elements", it.elements},
          {"nrmse", metric(it.stats.nrmse)},
          {"max_abs", metric(it.stats.max_abs)},
          {"n_diff", m ? Json(it.stats.n_diff) : Json(nullptr)},
          {"first_diff", m ? Json(it.stats.first_diff) : Json(nullptr)},
          {"non_finite",
           m ? Json(it.stats.non_finite || (it.has_kl && it.kl.non_finite)) : Json(nullptr)},
          {"code_diff", m && it.dtype == "int8" ? Json(it.code_diff) : Json(nullptr)},
          {"kl_max", kl ? Num(it.kl.kl_max) : Json(nullptr)},
          {"kl_mean", kl ? Num(it.kl.kl_mean) : Json(nullptr)},
          {"top1_agree", kl ? Json(it.kl.top1_agree) : Json(nullptr)},
          {"kl_rows", kl ? Json(it.kl.rows) : Json(nullptr)},
          {"nrmse_max", Num(it.nrmse_max)},
          {"kl_max_threshold", it.has_kl ? Num(it.kl_max) : Json(nullptr)}};
}

Json StateJson(const DiffResult& d) {
  Json first = nullptr;
  if (d.first_failure >= 0 && static_cast<std::size_t>(d.first_failure) < d.items.size()) {
    const ItemResult& f = d.items[static_cast<std::size_t>(d.first_failure)];
    first = {{"checkpoint", f.checkpoint},
             {"stage", f.stage},
             {"layer", f.layer},
             {"kind", f.kind},
             {"rel", f.rel},
             {"reason", FailureDetail(f)}};
  }
  Json cps = Json::array();
  for (const CheckpointSummary& c : d.checkpoints) {
    Json reasons = Json::object();
    for (const auto& [r, n] : c.skip_reasons) reasons[Redact(r)] = n;
    cps.push_back({{"name", c.name},
                   {"window", c.window},
                   {"point", c.point},
                   {"p", c.p},
                   {"T", c.T},
                   {"compared", c.compared},
                   {"passed", c.passed},
                   {"failed", c.failed},
                   {"skipped", c.skipped},
                   {"skip_reasons", reasons}});
  }
  Json items = Json::array();
  for (const ItemResult& it : d.items) items.push_back(ItemJson(it));
  return {{"passed", d.Passed()},
          {"model_differs", d.model_differs},
          {"request_differs", d.request_differs},
          {"output_differs", d.output_differs},
          {"compared", d.compared},
          {"passed_items", d.passed},
          {"failed", d.failed},
          {"skipped", d.skipped},
          {"first_failure", first},
          {"checkpoints", cps},
          {"items", items}};
}

Json AlignJson(const AlignResult& al) {
  Json timing = Json::array();
  for (const IntervalDiff& t : al.timing) {
    auto v = [&t](double x) { return t.known ? Num(x) : Json(nullptr); };
    timing.push_back({{"name", t.name},
                      {"known", t.known},
                      {"max_abs_delta_ms", v(t.max_abs_delta_ms)},
                      {"max_at", t.known ? Json(t.max_at) : Json(nullptr)},
                      {"median_delta_ms", v(t.median_delta_ms)},
                      {"median_abs_delta_ms", v(t.median_abs_delta_ms)},
                      {"sum_a_ms", v(t.sum_a_ms)},
                      {"sum_b_ms", v(t.sum_b_ms)},
                      {"rel_diff", v(t.rel_diff)}});
  }
  return {{"fields", al.fields},
          {"n_a", al.n_a},
          {"n_b", al.n_b},
          {"matched", al.matched},
          {"diverged", al.diverged},
          {"div_idx", al.diverged ? Json(al.div_idx) : Json(nullptr)},
          {"div_a", WindowJson(al.div_a)},
          {"div_b", WindowJson(al.div_b)},
          {"differing_fields", al.differing_fields},
          {"timing", timing},
          {"median_verify_ms_a", Num(al.median_verify_ms_a)},
          {"median_verify_ms_b", Num(al.median_verify_ms_b)},
          {"notable_a", NotableJson(al.notable_a)},
          {"notable_b", NotableJson(al.notable_b)},
          {"rest_a_count", al.rest_a.size()},
          {"rest_b_count", al.rest_b.size()}};
}

}  // namespace

std::string RenderJson(const ReportInput& in) {
  Json j;
  j["schema"] = "lockstep.report";
  j["schema_version"] = 1;
  j["title"] = in.title;
  j["verdict"] = VerdictJson(ReportVerdict(in));
  j["arms"] = {{"a", ArmJson(in.a, "A")}, {"b", ArmJson(in.b, "B")}};
  j["config_differences"] = ConfigDifferences(in);
  Json th = nullptr;
  if (in.diff != nullptr) {
    Json by_kind = Json::object();
    for (const auto& [k, v] : in.diff->thresholds.nrmse_by_kind) by_kind[k] = Num(v);
    th = {{"nrmse_max", Num(in.diff->thresholds.nrmse_max)},
          {"kl_max", Num(in.diff->thresholds.kl_max)},
          {"nrmse_by_kind", by_kind}};
  }
  j["thresholds"] = th;
  j["state"] = in.diff != nullptr ? StateJson(*in.diff) : Json(nullptr);
  j["alignment"] = in.align != nullptr ? AlignJson(*in.align) : Json(nullptr);
  j["limitations"] = Limitations(in);
  // replace: invalid UTF-8 from a file becomes U+FFFD instead of an exception.
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace lockstep
