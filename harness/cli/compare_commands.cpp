#include "lockstep/harness/compare_commands.h"

#include <fmt/format.h>

#include <ostream>
#include <sstream>

#include "lockstep/compare/align.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/report.h"
#include "lockstep/engine/atomic_file.h"

namespace lockstep {

namespace {

std::string Ms(double v) { return fmt::format("{:.3f}", v); }

Status WriteReports(const ReportOutputs& o, const ReportInput& in) {
  if (!o.json.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(o.json, RenderJson(in)));
  if (!o.md.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(o.md, RenderMarkdown(in)));
  if (!o.html.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(o.html, RenderHtml(in)));
  if (!o.junit.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(o.junit, RenderJUnit(in)));
  return Status::Ok();
}

std::string ThresholdLine(const Thresholds& th) {
  std::string s = "NRMSE <= " + FormatMetric(th.nrmse_max);
  if (!th.nrmse_by_kind.empty()) {
    s += " (overrides:";
    for (const auto& [k, v] : th.nrmse_by_kind) s += " " + k + " " + FormatMetric(v);
    s += ")";
  }
  return s + ", logits KL <= " + FormatMetric(th.kl_max);
}

std::string ItemWhere(const ItemResult& r) {
  std::string s = r.checkpoint + " stage " + std::to_string(r.stage);
  if (r.layer >= 0) s += " layer " + std::to_string(r.layer);
  return s + " " + r.kind + " (" + r.label + ")";
}

void PrintDiff(const DiffResult& d, const ArmInfo& a, const ArmInfo& b, bool quiet,
               std::ostream& out) {
  if (!quiet) {
    out << "lockstep diff: A = " << a.arm << " (run " << a.run_id << "), B = " << b.arm << " (run "
        << b.run_id << "); A is the reference\n";
    out << "thresholds: " << ThresholdLine(d.thresholds) << "\n";
    out << "masking: committed rows vs committed rows; speculative rows only against speculative "
           "rows of the same "
           "(p, T); unused paged tails never read\n";
    if (d.model_differs) out << "model: DIFFERS (model_sha256) - state not compared\n";
    if (d.request_differs) out << "request: DIFFERS (prompt tokens) - state not compared\n";
    if (d.config_differences.empty()) {
      out << "config: identical\n";
    } else {
      out << "config differences (A | B):\n";
      for (const auto& c : d.config_differences) out << "  " << c << "\n";
    }
    out << "output: " << (d.output_differs ? "DIFFERS" : "identical") << " (A " << a.output_tokens
        << " tokens, stop " << a.stop_reason << "; B " << b.output_tokens << " tokens, stop "
        << b.stop_reason << ")\n";
    out << fmt::format("{:<22} {:>8} {:>8} {:>8} {:>8}\n", "checkpoint", "compared", "passed",
                       "failed", "skipped");
    for (const auto& cs : d.checkpoints) {
      out << fmt::format("{:<22} {:>8} {:>8} {:>8} {:>8}", cs.name, cs.compared, cs.passed,
                         cs.failed, cs.skipped);
      for (const auto& [why, n] : cs.skip_reasons) out << "  [" << n << " skipped: " << why << "]";
      out << "\n";
    }
    if (d.first_failure >= 0) {
      const ItemResult& r = d.items[static_cast<std::size_t>(d.first_failure)];
      out << "first failing item: " << ItemWhere(r) << ": " << r.reason << "\n";
    }
    const double mb = static_cast<double>(d.bytes_read) / 1e6;
    out << fmt::format("read {:.1f} MB in {:.3f} s ({:.0f} MB/s)\n", mb, d.seconds,
                       d.seconds > 0 ? mb / d.seconds : 0.0);
  }
  out << (d.Passed() ? "PASS" : "FAIL") << ": " << d.compared << " items compared, " << d.passed
      << " passed, " << d.failed << " failed, " << d.skipped << " skipped\n";
}

void PrintAlign(const AlignResult& al, const std::string& na, const std::string& nb,
                std::ostream& out) {
  out << "lockstep align: " << na << " (" << al.n_a << " windows) vs " << nb << " (" << al.n_b
      << " windows) on ";
  for (std::size_t i = 0; i < al.fields.size(); ++i) out << (i ? "," : "") << al.fields[i];
  out << "\nmatched prefix: " << al.matched << " windows\n";
  if (!al.diverged) {
    out << "no path divergence over " << al.matched << " windows\n";
  } else {
    const WindowRecord* w = al.div_a ? &*al.div_a : al.div_b ? &*al.div_b : nullptr;
    out << "first path divergence at window " << al.div_idx;
    if (w) out << " (p=" << w->p << ")";
    out << ":\n";
    out << "  " << na << ": " << (al.div_a ? DescribeWindow(*al.div_a, al.fields) : "(trace ended)")
        << "\n";
    out << "  " << nb << ": " << (al.div_b ? DescribeWindow(*al.div_b, al.fields) : "(trace ended)")
        << "\n";
  }
  out << "timing over the matched prefix only (delta = " << nb << " - " << na << ", ms):\n";
  std::size_t name_w = std::string("interval").size();  // the name column fits dev_compute too
  for (const auto& t : al.timing) name_w = std::max(name_w, t.name.size());
  out << fmt::format("  {:<{}} {:>12} {:>12} {:>9} {:>12} {:>20}\n", "interval", name_w,
                     "sum " + na, "sum " + nb, "rel diff", "median delta", "max |delta| @window");
  for (const auto& t : al.timing) {
    if (!t.known) {
      out << fmt::format("  {:<{}} unknown (recorded as -1 on at least one side)\n", t.name,
                         name_w);
      continue;
    }
    out << fmt::format("  {:<{}} {:>12} {:>12} {:>+8.1f}% {:>12} {:>14} @{:<5}\n", t.name, name_w,
                       Ms(t.sum_a_ms), Ms(t.sum_b_ms), 100.0 * t.rel_diff, Ms(t.median_delta_ms),
                       Ms(t.max_abs_delta_ms), t.max_at);
  }
  if (al.timing.size() > TimingIntervals().size())
    out << "  (dev_*: CUDA-event spans on each stage's stream, summed over the stages; init: host "
           "set-up time)\n";
  if (al.diverged)
    out << "after the divergence: " << na << " ran " << al.rest_a.size() << " more windows, " << nb
        << " ran " << al.rest_b.size() << " (listed per side, not paired)\n";
  auto notable = [&](const std::vector<NotableWindow>& v, const std::string& n) {
    for (const auto& w : v)
      out << "notable: " << n << " had a " << Ms(w.verify_ms) << " ms T=" << w.T
          << " verify at its own window " << w.idx
          << fmt::format(" ({:.1f}x its median)", w.ratio_to_median)
          << (w.after_divergence ? ", after the divergence" : "") << "\n";
  };
  notable(al.notable_a, na);
  notable(al.notable_b, nb);
}

// Both exports opened and diffed with the command's thresholds.
struct Diffed {
  std::unique_ptr<ExportReader> ra, rb;
  DiffResult d;
};

Result<Diffed> OpenAndDiff(const DiffCommandOptions& opts) {
  Diffed x;
  ReaderLimits limits;
  limits.use_index = !opts.no_index;
  limits.isolate = opts.isolate;
  limits.isolate_timeout_s = opts.isolate_timeout_s;
  LOCKSTEP_ASSIGN_OR_RETURN(x.ra, ExportReader::Open(opts.a, limits));
  LOCKSTEP_ASSIGN_OR_RETURN(x.rb, ExportReader::Open(opts.b, limits));
  DiffOptions dopt = opts.diff;
  for (const auto& k : opts.kind_overrides)
    LOCKSTEP_RETURN_IF_ERROR(dopt.thresholds.SetKindOverride(k));
  LOCKSTEP_ASSIGN_OR_RETURN(x.d, DiffExports(*x.ra, *x.rb, dopt));
  return x;
}

Status DiffBody(const DiffCommandOptions& opts, std::ostream& out) {
  LOCKSTEP_ASSIGN_OR_RETURN(Diffed x, OpenAndDiff(opts));
  const auto& ra = x.ra;
  const auto& rb = x.rb;
  const DiffResult& d = x.d;
  ReportInput in;
  in.a = SummarizeArm(ra->meta(), "A");
  in.b = SummarizeArm(rb->meta(), "B");
  in.diff = &d;
  PrintDiff(d, in.a, in.b, opts.quiet, out);
  LOCKSTEP_RETURN_IF_ERROR(WriteReports(opts.reports, in));
  if (!d.Passed())
    return Status::GateFailed(
        "diff", std::to_string(d.failed) + " of " + std::to_string(d.compared) +
                    " compared items failed" +
                    (d.model_differs || d.request_differs ? " (model or request differ)" : ""));
  return Status::Ok();
}

// Window records of an export or of a JSON-lines trace.
Result<std::vector<WindowRecord>> LoadWindows(const std::string& path,
                                              const AlignCommandOptions& opts, std::string* arm) {
  if (LooksLikeHdf5(path)) {
    ReaderLimits limits;
    limits.use_index = !opts.no_index;
    limits.isolate = opts.isolate;
    limits.isolate_timeout_s = opts.isolate_timeout_s;
    LOCKSTEP_ASSIGN_OR_RETURN(auto r, ExportReader::Open(path, limits));
    if (!r->meta().arm.empty()) *arm = r->meta().arm;
    return r->meta().windows;
  }
  std::string torn;
  LOCKSTEP_ASSIGN_OR_RETURN(auto windows, ReadWindowRecords(path, &torn));
  if (!torn.empty())
    std::fprintf(stderr,
                 "lockstep: warning: %s; the writer was killed mid-record, so the %zu whole "
                 "windows before it are read\n",
                 torn.c_str(), windows.size());
  return windows;
}

Status AlignBody(const AlignCommandOptions& opts, std::ostream& out) {
  AlignOptions ao;
  LOCKSTEP_ASSIGN_OR_RETURN(ao.fields, ParseAlignFields(opts.fields));
  std::string na = "A", nb = "B";
  LOCKSTEP_ASSIGN_OR_RETURN(auto wa, LoadWindows(opts.a, opts, &na));
  LOCKSTEP_ASSIGN_OR_RETURN(auto wb, LoadWindows(opts.b, opts, &nb));
  if (na == nb) na += " (A)", nb += " (B)";
  AlignResult al = AlignWindows(wa, wb, ao);
  PrintAlign(al, na, nb, out);
  ReportInput in;
  in.a.arm = na;
  in.b.arm = nb;
  in.a.windows = static_cast<std::int64_t>(wa.size());
  in.b.windows = static_cast<std::int64_t>(wb.size());
  in.align = &al;
  in.windows_a = &wa;
  in.windows_b = &wb;
  LOCKSTEP_RETURN_IF_ERROR(WriteReports(opts.reports, in));
  if (opts.fail_on_divergence && al.diverged)
    return Status::GateFailed("align", "paths diverge at window " + std::to_string(al.div_idx));
  return Status::Ok();
}

Status SummarizeBody(const SummarizeCommandOptions& opts, std::ostream& out) {
  const DiffCommandOptions& dc = opts.diff;
  LOCKSTEP_ASSIGN_OR_RETURN(Diffed x, OpenAndDiff(dc));
  const auto& ra = x.ra;
  const auto& rb = x.rb;
  const DiffResult& d = x.d;
  AlignOptions ao;
  LOCKSTEP_ASSIGN_OR_RETURN(ao.fields, ParseAlignFields(opts.fields));
  AlignResult al = AlignWindows(ra->meta().windows, rb->meta().windows, ao);
  ReportInput in;
  in.a = SummarizeArm(ra->meta(), "A");
  in.b = SummarizeArm(rb->meta(), "B");
  if (in.a.arm == in.b.arm) in.a.arm += " (A)", in.b.arm += " (B)";
  in.diff = &d;
  in.align = &al;
  in.windows_a = &ra->meta().windows;
  in.windows_b = &rb->meta().windows;
  PrintDiff(d, in.a, in.b, dc.quiet, out);
  out << "\n";
  PrintAlign(al, in.a.arm, in.b.arm, out);
  for (const auto& l : Limitations(in)) out << "limitation: " << l << "\n";
  LOCKSTEP_RETURN_IF_ERROR(WriteReports(dc.reports, in));
  if (!d.Passed())
    return Status::GateFailed("summarize", std::to_string(d.failed) + " items failed");
  return Status::Ok();
}

}  // namespace

Result<std::int64_t> ParseByteSize(std::string_view text, std::string_view option) {
  std::string t(text);
  if (t.empty()) return Status::InvalidArgument(option, "empty size");
  std::int64_t mult = 1;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  const std::string units = "KMGT";
  if (auto u = units.find(last); u != std::string::npos) {
    mult = std::int64_t{1} << (10 * (u + 1));
    t.pop_back();
    if (!t.empty() && (t.back() == 'i' || t.back() == 'I')) t.pop_back();
  } else if (last == 'B') {
    t.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !(v > 0) || v * static_cast<double>(mult) > 9e18)
    return Status::InvalidArgument(
        option, "expected a size like 512M or 1G, got '" + std::string(text) + "'");
  return static_cast<std::int64_t>(v * static_cast<double>(mult));
}

// Isolation is the reader's (ExportReader::Open in a child per file): the commands themselves
// run in this process.
Status RunDiff(const DiffCommandOptions& opts, std::ostream& out) { return DiffBody(opts, out); }

Status RunAlign(const AlignCommandOptions& opts, std::ostream& out) { return AlignBody(opts, out); }

Status RunSummarize(const SummarizeCommandOptions& opts, std::ostream& out) {
  return SummarizeBody(opts, out);
}

}  // namespace lockstep
