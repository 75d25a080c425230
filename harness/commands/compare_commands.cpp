#include "lockstep/harness/compare_commands.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <future>
#include <map>
#include <ostream>
#include <sstream>

#include "commands/output.h"
#include "commands/terminal.h"
#include "lockstep/compare/align.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/compare/port_check.h"
#include "lockstep/compare/report.h"
#include "lockstep/engine/atomic_file.h"

namespace lockstep {

namespace {

std::string Ms(double v) { return fmt::format("{:.3f}", v); }

// Each through WriteOutput (cli/output.h): "-" is stdout.
Status WriteReports(const ReportOutputs& o, const ReportInput& in) {
  if (!o.json.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.json, RenderJson(in)));
  if (!o.md.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.md, RenderMarkdown(in)));
  if (!o.html.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.html, RenderHtml(in)));
  if (!o.junit.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.junit, RenderJUnit(in)));
  return Status::Ok();
}

// The report paths' folders, checked before any work (a missing one is bad input, exit 2).
Status CheckReportFolders(const ReportOutputs& o) {
  for (const auto& [path, what] : {std::pair{o.json, "--json"}, std::pair{o.md, "--md"},
                                   std::pair{o.html, "--html"}, std::pair{o.junit, "--junit"}})
    if (!path.empty() && path != "-") LOCKSTEP_RETURN_IF_ERROR(CheckOutputFolder(path, what));
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

void PrintDiff(const DiffResult& d, const ArmInfo& a, const ArmInfo& b, bool quiet, bool color,
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
  if (d.skipped > 0) {
    std::map<std::string, int> reasons;
    for (const auto& cs : d.checkpoints)
      for (const auto& [why, n] : cs.skip_reasons) reasons[why] += n;
    out << "skipped by reason:\n";
    for (const auto& [why, n] : reasons) out << "  " << n << ": " << why << "\n";
  }
  const std::string counts = fmt::format("{} items compared, {} passed, {} failed, {} skipped",
                                         d.compared, d.passed, d.failed, d.skipped);
  if (d.compared == 0 && !d.vacuous.empty()) {
    out << Paint("FAIL", Tint::kRed, color) << ": " << Paint(d.vacuous, Tint::kYellow, color)
        << " (0 items compared, " << d.skipped << " skipped)\n";
  } else {
    out << (d.Passed() ? Paint("PASS", Tint::kGreen, color) : Paint("FAIL", Tint::kRed, color))
        << ": " << counts << (d.vacuous.empty() ? "" : " (" + d.vacuous + ")") << "\n";
  }
}

// Why a diff did not pass, for its GateFailed status.
std::string DiffFailure(const DiffResult& d) {
  if (d.model_differs || d.request_differs)
    return std::string("state not compared: the ") + (d.model_differs ? "models" : "requests") +
           " differ";
  if (d.failed > 0)
    return std::to_string(d.failed) + " of " + std::to_string(d.compared) +
           " compared items failed";
  return d.vacuous;
}

// A and B the same file (device and inode): kInvalidArgument unless allowed.
Status CheckNotSameFile(const std::string& a, const std::string& b, bool allow_self,
                        const char* command) {
  struct stat sa {};
  struct stat sb {};
  if (allow_self || ::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0)
    return Status::Ok();  // a missing file is reported by whoever opens it
  if (sa.st_dev != sb.st_dev || sa.st_ino != sb.st_ino) return Status::Ok();
  return Status::InvalidArgument(command, "A '" + a + "' and B '" + b +
                                              "' are the same file: comparing a run with itself "
                                              "proves nothing (--allow-self to do it anyway)");
}

// The alignment's verdict in one line: DIFFERS (not comparable), DIVERGED, NOT CHECKED (the path
// fields cannot differ) or PASS.
std::string AlignVerdict(const AlignResult& al, bool color) {
  if (!al.comparable()) {
    std::string why;
    for (const auto& f : al.fingerprint_differences)
      if (f.rfind("config: ", 0) != 0) why += (why.empty() ? "" : "; ") + f;
    return Paint("DIFFERS", Tint::kRed, color) + ": " + why +
           ": the paths are not comparable, no divergence is claimed";
  }
  if (al.diverged)
    return Paint("DIVERGED", Tint::kRed, color) + ": first path divergence at window " +
           std::to_string(al.div_idx);
  if (!al.path_unchecked.empty())
    return Paint("NOT CHECKED", Tint::kYellow, color) + ": " + al.path_unchecked;
  return Paint("PASS", Tint::kGreen, color) + ": no path divergence over " +
         std::to_string(al.matched) + " windows";
}

// `fingerprints`: whether both inputs were exports (traces carry no fingerprint).
void PrintAlign(const AlignResult& al, const std::string& na, const std::string& nb,
                bool fingerprints, bool color, std::ostream& out) {
  out << "lockstep align: " << na << " (" << al.n_a << " windows) vs " << nb << " (" << al.n_b
      << " windows) on ";
  for (std::size_t i = 0; i < al.fields.size(); ++i) out << (i ? "," : "") << al.fields[i];
  out << "\n";
  if (!fingerprints)
    out << "fingerprints: not checked (a JSON-lines trace carries no model, request or config "
           "fingerprint; align the exports to check them)\n";
  else if (al.fingerprint_differences.empty())
    out << "fingerprints: model, request and config identical\n";
  for (const auto& f : al.fingerprint_differences)
    out << (f.rfind("config: ", 0) == 0 ? "config differs (A | B): " + f.substr(8)
                                        : "DIFFERS: " + f)
        << "\n";
  out << "matched prefix: " << al.matched << " windows\n";
  if (!al.diverged) {
    if (!al.comparable())
      out << "no divergence is claimed: the paths of different models or requests are not "
             "comparable\n";
    else if (!al.path_unchecked.empty())
      out << "path not checked: " << al.path_unchecked << "\n";
    else
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
  out << AlignVerdict(al, color) << "\n";
}

// Both exports opened and diffed with the command's thresholds.
struct Diffed {
  std::unique_ptr<ExportReader> ra, rb;
  DiffResult d;
};

// Both exports opened (A's error, if any, is the one reported).
Status OpenBoth(const DiffCommandOptions& opts, Diffed& x) {
  ReaderLimits limits;
  limits.use_index = !opts.no_index;
  limits.isolate = opts.isolate;
  limits.isolate_timeout_s = opts.isolate_timeout_s;
  if (opts.isolate) {
    // Isolated opens run in children, so the two sides parse at the same time (in process they
    // cannot: libhdf5 is not thread-safe). A's error, if any, is still the one reported.
    auto b = std::async(std::launch::async, [&] { return ExportReader::Open(opts.b, limits); });
    auto a = ExportReader::Open(opts.a, limits);
    auto rb = b.get();
    LOCKSTEP_ASSIGN_OR_RETURN(x.ra, std::move(a));
    LOCKSTEP_ASSIGN_OR_RETURN(x.rb, std::move(rb));
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(x.ra, ExportReader::Open(opts.a, limits));
    LOCKSTEP_ASSIGN_OR_RETURN(x.rb, ExportReader::Open(opts.b, limits));
  }
  return Status::Ok();
}

// The A/A diff of two opened exports with the command's thresholds.
Status DiffOpened(const DiffCommandOptions& opts, Diffed& x) {
  DiffOptions dopt = opts.diff;
  for (const auto& k : opts.kind_overrides)
    LOCKSTEP_RETURN_IF_ERROR(dopt.thresholds.SetKindOverride(k));
  LOCKSTEP_ASSIGN_OR_RETURN(x.d, DiffExports(*x.ra, *x.rb, dopt));
  return Status::Ok();
}

// Exports of two engines (lockstep and llama.cpp): not an A/A pair, the port check's.
Status RefuseCrossEngine(const Diffed& x, const char* command) {
  if (!IsCrossEngine(x.ra->meta(), x.rb->meta())) return Status::Ok();
  return Status::InvalidArgument(command, "A (" + ExportEngine(x.ra->meta()) + ") and B (" +
                                              ExportEngine(x.rb->meta()) +
                                              ") are exports of different engines: compare them "
                                              "with `lockstep diff A B` (the port check)");
}

Result<Diffed> OpenAndDiff(const DiffCommandOptions& opts, const char* command) {
  Diffed x;
  LOCKSTEP_RETURN_IF_ERROR(OpenBoth(opts, x));
  LOCKSTEP_RETURN_IF_ERROR(RefuseCrossEngine(x, command));
  LOCKSTEP_RETURN_IF_ERROR(DiffOpened(opts, x));
  return x;
}

// The cross-engine profile with the thresholds the command line gave instead.
PortThresholds PortProfile(const DiffCommandOptions& opts) {
  PortThresholds th = CrossEngineProfile();
  if (opts.nrmse_max_given) {
    th.logits_nrmse_max = th.op_nrmse_max = opts.diff.thresholds.nrmse_max;
    th.overridden.push_back("--nrmse-max " + FormatMetric(opts.diff.thresholds.nrmse_max));
  }
  if (opts.kl_max_given) {
    th.kl_max = opts.diff.thresholds.kl_max;
    th.overridden.push_back("--kl-max " + FormatMetric(opts.diff.thresholds.kl_max));
  }
  return th;
}

// `lockstep diff` of a lockstep and a llama.cpp export (port_check.h): steps and the op table.
Status PortBody(const DiffCommandOptions& opts, const Diffed& x, std::ostream& out) {
  const ReportOutputs& o = opts.reports;
  for (const auto& [path, what] :
       {std::pair{o.md, "--md"}, std::pair{o.html, "--html"}, std::pair{o.junit, "--junit"}})
    if (!path.empty())
      return Status::InvalidArgument(what,
                                     "is not written for a cross-engine diff (the port "
                                     "check); it writes the text and --json");
  LOCKSTEP_ASSIGN_OR_RETURN(PortResult r, PortCheck(*x.ra, *x.rb, PortProfile(opts)));
  out << (opts.quiet ? PortVerdictLine(r) + "\n" : PortText(r, opts.a, opts.b));
  if (!o.json.empty()) LOCKSTEP_RETURN_IF_ERROR(WriteOutput(o.json, PortJson(r, opts.a, opts.b)));
  if (!r.Passed()) return Status::GateFailed("diff", PortVerdictLine(r));
  return Status::Ok();
}

Status DiffBody(const DiffCommandOptions& opts, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(CheckReportFolders(opts.reports));
  LOCKSTEP_RETURN_IF_ERROR(CheckNotSameFile(opts.a, opts.b, opts.diff.allow_self, "diff"));
  Diffed x;
  LOCKSTEP_RETURN_IF_ERROR(OpenBoth(opts, x));
  if (IsCrossEngine(x.ra->meta(), x.rb->meta())) return PortBody(opts, x, out);
  LOCKSTEP_RETURN_IF_ERROR(DiffOpened(opts, x));
  const auto& ra = x.ra;
  const auto& rb = x.rb;
  const DiffResult& d = x.d;
  ReportInput in;
  in.a = SummarizeArm(ra->meta(), "A");
  in.b = SummarizeArm(rb->meta(), "B");
  in.diff = &d;
  PrintDiff(d, in.a, in.b, opts.quiet, opts.color, out);
  LOCKSTEP_RETURN_IF_ERROR(WriteReports(opts.reports, in));
  if (!d.Passed()) return Status::GateFailed("diff", DiffFailure(d));
  return Status::Ok();
}

// Window records of an export or of a JSON-lines trace.
// One side of an alignment: an export (its reader, so its fingerprints and arm facts reach the
// report) or a JSON-lines trace (windows only; what a trace does not carry stays unknown).
struct AlignSide {
  std::unique_ptr<ExportReader> reader;  // null for a trace
  std::vector<WindowRecord> windows;
  ArmInfo info;
};

Result<AlignSide> LoadSide(const std::string& path, const AlignCommandOptions& opts,
                           const std::string& fallback_name) {
  AlignSide side;
  if (LooksLikeHdf5(path)) {
    ReaderLimits limits;
    limits.use_index = !opts.no_index;
    limits.isolate = opts.isolate;
    limits.isolate_timeout_s = opts.isolate_timeout_s;
    LOCKSTEP_ASSIGN_OR_RETURN(side.reader, ExportReader::Open(path, limits));
    side.windows = side.reader->meta().windows;
    side.info = SummarizeArm(side.reader->meta(), fallback_name);
    return side;
  }
  std::string torn;
  LOCKSTEP_ASSIGN_OR_RETURN(side.windows, ReadWindowRecords(path, &torn));
  if (!torn.empty())
    std::fprintf(stderr,
                 "lockstep: warning: %s; the writer was killed mid-record, so the %zu whole "
                 "windows before it are read\n",
                 torn.c_str(), side.windows.size());
  side.info.arm = fallback_name;
  side.info.windows = static_cast<std::int64_t>(side.windows.size());
  return side;
}

// Both inputs exports: the same-run check and the fingerprints `diff` checks, into al.
Status CheckAlignIdentity(const AlignCommandOptions& opts, const ExportMeta& ma,
                          const ExportMeta& mb, AlignResult& al) {
  if (!opts.allow_self && !ma.run_id.empty() && ma.run_id == mb.run_id)
    return Status::InvalidArgument(
        "align",
        "both exports are of the same run (run_id " + ma.run_id +
            "): comparing a run with itself proves nothing (--allow-self to do it anyway)");
  al.fingerprint_differences = FingerprintDifferences(ma, mb);
  return Status::Ok();
}

Status AlignBody(const AlignCommandOptions& opts, std::ostream& out) {
  LOCKSTEP_RETURN_IF_ERROR(CheckReportFolders(opts.reports));
  LOCKSTEP_RETURN_IF_ERROR(CheckNotSameFile(opts.a, opts.b, opts.allow_self, "align"));
  AlignOptions ao;
  LOCKSTEP_ASSIGN_OR_RETURN(ao.fields, ParseAlignFields(opts.fields));
  LOCKSTEP_ASSIGN_OR_RETURN(AlignSide sa, LoadSide(opts.a, opts, "A"));
  LOCKSTEP_ASSIGN_OR_RETURN(AlignSide sb, LoadSide(opts.b, opts, "B"));
  ReportInput in;
  in.a = std::move(sa.info);
  in.b = std::move(sb.info);
  if (in.a.arm == in.b.arm) in.a.arm += " (A)", in.b.arm += " (B)";
  AlignResult al = AlignWindows(sa.windows, sb.windows, ao);
  const bool exports = sa.reader && sb.reader;
  if (exports)
    LOCKSTEP_RETURN_IF_ERROR(CheckAlignIdentity(opts, sa.reader->meta(), sb.reader->meta(), al));
  PrintAlign(al, in.a.arm, in.b.arm, exports, opts.color, out);
  in.align = &al;
  in.windows_a = &sa.windows;
  in.windows_b = &sb.windows;
  LOCKSTEP_RETURN_IF_ERROR(WriteReports(opts.reports, in));
  // Paths of different models or requests are not comparable: bad input, as `diff` says of the
  // same pair (exit 2), never a pass.
  if (!al.comparable()) {
    std::string why;
    for (const auto& f : al.fingerprint_differences)
      if (f.rfind("config: ", 0) != 0) why += (why.empty() ? "" : "; ") + f;
    return Status::InvalidArgument(
        "align", "the paths are not comparable (" + why + "): align runs of one model and request");
  }
  if (!opts.fail_on_divergence) return Status::Ok();
  if (al.diverged)
    return Status::GateFailed("align", "paths diverge at window " + std::to_string(al.div_idx));
  if (!al.path_unchecked.empty())
    return Status::GateFailed("align", "nothing compared: " + al.path_unchecked);
  return Status::Ok();
}

Status SummarizeBody(const SummarizeCommandOptions& opts, std::ostream& out) {
  const DiffCommandOptions& dc = opts.diff;
  LOCKSTEP_RETURN_IF_ERROR(CheckReportFolders(dc.reports));
  LOCKSTEP_RETURN_IF_ERROR(CheckNotSameFile(dc.a, dc.b, dc.diff.allow_self, "summarize"));
  LOCKSTEP_ASSIGN_OR_RETURN(Diffed x, OpenAndDiff(dc, "summarize"));
  const auto& ra = x.ra;
  const auto& rb = x.rb;
  const DiffResult& d = x.d;
  AlignOptions ao;
  LOCKSTEP_ASSIGN_OR_RETURN(ao.fields, ParseAlignFields(opts.fields));
  AlignResult al = AlignWindows(ra->meta().windows, rb->meta().windows, ao);
  al.fingerprint_differences = FingerprintDifferences(ra->meta(), rb->meta());
  ReportInput in;
  in.a = SummarizeArm(ra->meta(), "A");
  in.b = SummarizeArm(rb->meta(), "B");
  if (in.a.arm == in.b.arm) in.a.arm += " (A)", in.b.arm += " (B)";
  in.diff = &d;
  in.align = &al;
  in.windows_a = &ra->meta().windows;
  in.windows_b = &rb->meta().windows;
  PrintDiff(d, in.a, in.b, dc.quiet, dc.color, out);
  out << "\n";
  PrintAlign(al, in.a.arm, in.b.arm, /*fingerprints=*/true, dc.color, out);
  for (const auto& l : Limitations(in)) out << "limitation: " << l << "\n";
  LOCKSTEP_RETURN_IF_ERROR(WriteReports(dc.reports, in));
  if (!d.Passed()) return Status::GateFailed("summarize", DiffFailure(d));
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
