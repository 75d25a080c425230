// HTML rendering of report.h: RenderHtml (the Markdown report's sections as HTML, so both always
// say the same) and its two inline SVG charts: per-window verify time of both arms with the first
// path divergence marked, and an NRMSE heat map (item group x checkpoint).
//
// The page (HtmlDocument: the one ReportStylesheet()) opens with the verdict box and has no scripts
// and no external references (the SVG elements carry no namespace URL: HTML5 does not need one), so
// it stays self-contained. Every text is escaped; the Markdown becomes HTML through
// markdown_html.h, as the campaign report's does.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "lockstep/compare/markdown_html.h"
#include "lockstep/compare/report.h"

namespace lockstep {
namespace {

// ---- charts ----

constexpr std::array<const char*, 2> kArmColours = {
    "#1f77b4", "#e6550d"};  // blue / orange: distinct in greyscale too

std::string F(double v) { return fmt::format("{:.1f}", v); }

// A "nice" tick step (1, 2 or 5 x 10^k) giving about `ticks` intervals over [0, span].
double NiceStep(double span, int ticks) {
  if (!(span > 0.0)) return 1.0;
  const double raw = span / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10.0 * mag;
}

std::string TickLabel(double v, double step) {
  if (step >= 1.0) return fmt::format("{:.0f}", v);
  const int digits = static_cast<int>(std::ceil(-std::log10(step)));
  return fmt::format("{:.{}f}", v, digits);
}

std::string Placeholder(int w, int h, const std::string& title, const std::string& text) {
  return fmt::format(
      "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" "
      "aria-label=\"{2}\">\n<title>{2}</title>\n"
      "<rect x=\"0.5\" y=\"0.5\" width=\"{3}\" height=\"{4}\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n"
      "<text x=\"{5}\" y=\"{6}\" text-anchor=\"middle\" font-size=\"13\" "
      "fill=\"#555\">{7}</text>\n</svg>\n",
      w, h, XmlEscape(title), w - 1, h - 1, w / 2, h / 2, XmlEscape(text));
}

// (index, verify ms) of one trace; unknown verify times (< 0) are left out. Long traces are
// reduced to the minimum and maximum of each bucket, so spikes survive and the SVG stays small.
std::vector<std::pair<double, double>> VerifyPoints(const std::vector<WindowRecord>& v) {
  constexpr std::size_t kMaxPoints = 1500;
  std::vector<std::pair<double, double>> pts;
  const std::size_t bucket =
      v.size() <= kMaxPoints ? 1 : (v.size() + kMaxPoints / 2 - 1) / (kMaxPoints / 2);
  for (std::size_t b0 = 0; b0 < v.size(); b0 += bucket) {
    const std::size_t b1 = std::min(v.size(), b0 + bucket);
    std::size_t lo = b1, hi = b1;
    for (std::size_t i = b0; i < b1; ++i) {
      if (v[i].verify_ns < 0) continue;
      if (lo == b1 || v[i].verify_ns < v[lo].verify_ns) lo = i;
      if (hi == b1 || v[i].verify_ns > v[hi].verify_ns) hi = i;
    }
    if (lo == b1) continue;
    for (std::size_t i : {std::min(lo, hi), std::max(lo, hi)}) {
      pts.emplace_back(static_cast<double>(i), static_cast<double>(v[i].verify_ns) / 1e6);
      if (lo == hi) break;
    }
  }
  return pts;
}

// ---- heat map helpers ----

struct Rgb {
  double r, g, b;
};

std::string Hex(Rgb c) {
  auto ch = [](double x) { return static_cast<int>(std::lround(std::clamp(x, 0.0, 255.0))); };
  return fmt::format("#{:02x}{:02x}{:02x}", ch(c.r), ch(c.g), ch(c.b));
}

// t in [0, 1]: green (1e-6 x threshold and below) -> yellow (the threshold) -> red (100 x and
// above).
std::string ScaleColour(double t) {
  constexpr Rgb kLow{26, 152, 80}, kMid{254, 224, 139}, kHigh{165, 0, 38};
  t = std::clamp(t, 0.0, 1.0);
  const Rgb a = t <= 0.5 ? kLow : kMid, b = t <= 0.5 ? kMid : kHigh;
  const double u = t <= 0.5 ? t / 0.5 : (t - 0.5) / 0.5;
  return Hex({a.r + (b.r - a.r) * u, a.g + (b.g - a.g) * u, a.b + (b.b - a.b) * u});
}

constexpr const char* kEqualColour = "#2166ac";  // NRMSE exactly 0: bitwise (or numerically) equal
constexpr const char* kNonFiniteColour = "#000000";
constexpr const char* kSkippedColour = "#bdbdbd";

// log10(NRMSE / threshold): -6 -> 0, 0 (at the threshold) -> 0.5, +2 -> 1.
double ScalePosition(double ratio) {
  const double r = std::log10(ratio);
  return r <= 0.0 ? 0.5 * std::max(0.0, (r + 6.0) / 6.0) : 0.5 + 0.5 * std::min(1.0, r / 2.0);
}

struct Cell {
  int n = 0, failed = 0, skipped = 0;
  bool non_finite = false, failed_without_metric = false;
  double worst_ratio = -1.0;  // max NRMSE / threshold over compared items (-1: none compared)
  double worst_nrmse = 0.0, worst_threshold = 0.0;
  std::string worst_rel;  // reasons are free text from the export: the tables show them, redacted
};

double ThresholdOf(const DiffResult& d, const ItemResult& it) {
  if (it.nrmse_max > 0.0) return it.nrmse_max;
  auto o = d.thresholds.nrmse_by_kind.find(it.kind);
  return o != d.thresholds.nrmse_by_kind.end() ? o->second : d.thresholds.nrmse_max;
}

// Row key: (stage, layer with non-layer groups after every layer, group name).
using RowKey = std::tuple<int, int, std::string>;

RowKey RowOf(const ItemResult& it) {
  if (it.layer >= 0) return {it.stage, it.layer, fmt::format("L{}", it.layer)};
  const std::optional<ItemKind> kind = ParseItemKind(it.kind);
  std::string group = kind == ItemKind::kMtpK || kind == ItemKind::kMtpV ? "mtp" : it.kind;
  return {it.stage, 1 << 20, group};
}

std::string RowLabel(const RowKey& k) {
  const int stage = std::get<0>(k);
  return (stage >= 0 ? fmt::format("s{} ", stage) : std::string("s? ")) + std::get<2>(k);
}

std::string ColumnLabel(const CheckpointSummary& c) {
  if (c.point.empty()) return c.name;
  const std::optional<CheckpointPoint> p = ParseCheckpointPoint(c.point);
  const std::string point = p == CheckpointPoint::kPreVerify    ? "pre"
                            : p == CheckpointPoint::kPostVerify ? "post"
                                                                : c.point;
  return fmt::format("{} {}", c.window, point);
}

// Beyond this many checkpoint columns cells are too thin to read; the JSON report has everything.
constexpr std::size_t kMaxHeatmapColumns = 400;

// The heat map's columns: the diff's checkpoints in order, then any checkpoint only items name,
// cut to kMaxHeatmapColumns.
struct HeatmapColumns {
  std::vector<std::string> names, labels;
  std::map<std::string, std::size_t> index;  // items are many: no linear search per item
  bool truncated = false;
};

HeatmapColumns CollectColumns(const DiffResult& d) {
  HeatmapColumns hc;
  for (const CheckpointSummary& c : d.checkpoints) {
    hc.names.push_back(c.name);
    hc.labels.push_back(ColumnLabel(c));
  }
  for (std::size_t j = 0; j < hc.names.size(); ++j) hc.index.emplace(hc.names[j], j);
  for (const ItemResult& it : d.items) {
    if (hc.index.emplace(it.checkpoint, hc.names.size()).second) {
      hc.names.push_back(it.checkpoint);
      hc.labels.push_back(it.checkpoint);
    }
  }
  hc.truncated = hc.names.size() > kMaxHeatmapColumns;
  if (hc.truncated) hc.names.resize(kMaxHeatmapColumns);
  return hc;
}

using HeatmapGrid = std::map<RowKey, std::map<std::size_t, Cell>>;  // row -> column index -> cell

// Folds every item into the cell of its row group and checkpoint column.
HeatmapGrid BuildGrid(const DiffResult& d, const HeatmapColumns& hc) {
  const std::vector<std::string>& cols = hc.names;
  HeatmapGrid grid;
  for (const ItemResult& it : d.items) {
    const std::size_t col = hc.index.at(it.checkpoint);
    if (col >= cols.size()) continue;
    Cell& c = grid[RowOf(it)][col];
    ++c.n;
    if (it.verdict == Verdict::kSkip) {
      ++c.skipped;
      continue;
    }
    if (it.verdict == Verdict::kFail) ++c.failed;
    if (it.elements == 0) {  // failed before any value was compared (missing, shape or dtype)
      c.failed_without_metric = c.failed_without_metric || it.verdict == Verdict::kFail;
      continue;
    }
    if (it.stats.non_finite || (it.has_kl && it.kl.non_finite)) c.non_finite = true;
    const double thr = ThresholdOf(d, it);
    const double ratio = thr > 0.0 ? it.stats.nrmse / thr : (it.stats.nrmse > 0.0 ? INFINITY : 0.0);
    if (std::isfinite(it.stats.nrmse) && ratio > c.worst_ratio) {
      c.worst_ratio = ratio;
      c.worst_nrmse = it.stats.nrmse;
      c.worst_threshold = thr;
      c.worst_rel = it.rel;
    }
  }
  return grid;
}

// A cell's fill colour and the words its tooltip ends with.
std::pair<std::string, std::string> CellStyle(const Cell& c) {
  std::string fill, what;
  if (c.non_finite) {
    fill = kNonFiniteColour;
    what = "non-finite values";
  } else if (c.failed_without_metric) {
    fill = ScaleColour(1.0);
    what = "failed before any value was compared (reason in the report)";
  } else if (c.skipped == c.n) {
    fill = kSkippedColour;
    what = "skipped (reason in the report)";
  } else if (c.failed > 0 && c.worst_ratio <= 1.0) {  // failed on another metric (logits KL)
    fill = ScaleColour(1.0);
    what = fmt::format("failed (NRMSE {} within its threshold; another metric failed)",
                       FormatMetric(c.worst_nrmse));
  } else if (c.worst_ratio <= 0.0) {
    fill = kEqualColour;
    what = "NRMSE 0";
  } else {
    fill = ScaleColour(ScalePosition(c.worst_ratio));
    what = fmt::format("worst NRMSE {} (threshold {}) in {}", FormatMetric(c.worst_nrmse),
                       FormatMetric(c.worst_threshold), c.worst_rel);
  }
  return {fill, what};
}

// The legend below the grid (its top at y = ly): the continuous scale as swatches, then the
// special colours.
std::string HeatmapLegend(int left, int ly) {
  std::string s;
  s += fmt::format("<text x=\"{}\" y=\"{}\">NRMSE / threshold (log scale):</text>\n", left, ly - 4);
  constexpr int kSwatches = 9, kSw = 22;
  for (int i = 0; i < kSwatches; ++i) {
    const double t = static_cast<double>(i) / (kSwatches - 1);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"10\" fill=\"{}\"/>",
                     left + i * kSw, ly, kSw, ScaleColour(t));
  }
  s += fmt::format(
      "\n<text x=\"{}\" y=\"{}\">&lt;=1e-6</text><text x=\"{}\" y=\"{}\" "
      "text-anchor=\"middle\">threshold</text>"
      "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">&gt;=100x</text>\n",
      left, ly + 22, left + kSwatches * kSw / 2, ly + 22, left + kSwatches * kSw, ly + 22);
  int lx = left + kSwatches * kSw + 24;
  for (const auto& [colour, label] :
       std::array<std::pair<const char*, const char*>, 3>{{{kEqualColour, "NRMSE 0 (equal)"},
                                                           {kNonFiniteColour, "non-finite"},
                                                           {kSkippedColour, "skipped"}}}) {
    s += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" "
        "y=\"{}\">{}</text>\n",
        lx, ly, colour, lx + 14, ly + 9, label);
    lx += 130;
  }
  return s;
}

}  // namespace

std::string RenderHtml(const ReportInput& in) {
  const std::string md = RenderMarkdown(in);
  static const std::vector<WindowRecord> kNone;
  static const AlignResult kNoAlign;
  static const DiffResult kNoDiff;
  // Charts close the section they illustrate.
  const std::map<std::string, std::string> charts = {
      {"Early state checks", SvgNrmseHeatmap(in.diff != nullptr ? *in.diff : kNoDiff)},
      {"Timing and execution-path observations",
       SvgVerifyChart(in.align != nullptr ? *in.align : kNoAlign,
                      in.windows_a ? *in.windows_a : kNone, in.windows_b ? *in.windows_b : kNone,
                      in.a.arm.empty() ? "A" : in.a.arm, in.b.arm.empty() ? "B" : in.b.arm)}};
  // The verdict box opens the body (HtmlVerdictBox, coloured); the Markdown's own box and "# "
  // title line are replaced by it and the <h1>.
  std::string h = HtmlVerdictBox(ReportVerdict(in)) + "<h1>" + HtmlEscape(in.title) + "</h1>\n";
  // Split the Markdown at its "## " headings; the "# " title line is replaced by the <h1> above.
  std::string current, body;
  auto flush = [&] {
    if (current.empty()) {
      h += MarkdownToHtml(body);
    } else {
      auto chart = charts.find(current);
      h += "<section>\n<h2>" + HtmlEscape(current) + "</h2>\n" + MarkdownToHtml(body) +
           (chart != charts.end() ? chart->second : "") + "</section>\n";
    }
    body.clear();
  };
  std::size_t pos = md.starts_with("# ") ? 0 : md.find("\n# ");
  pos = pos == std::string::npos ? md.size() : pos + (md.starts_with("# ") ? 0 : 1);
  while (pos < md.size()) {
    std::size_t e = md.find('\n', pos);
    if (e == std::string::npos) e = md.size();
    const std::string_view line(md.data() + pos, e - pos);
    pos = e + 1;
    if (line.starts_with("## ")) {
      flush();
      current = std::string(line.substr(3));
    } else if (!line.starts_with("# ")) {
      body += std::string(line) + "\n";
    }
  }
  flush();
  return HtmlDocument(in.title, h);
}

std::string HtmlVerdictBox(const VerdictBox& v) {
  const std::string tone = v.tone == VerdictTone::kPass   ? "pass"
                           : v.tone == VerdictTone::kFail ? "fail"
                                                          : "warn";
  std::string h = "<div id=\"verdict\" class=\"verdict verdict-" + tone +
                  "\" role=\"status\">\n<p class=\"word\">" + HtmlEscape(v.label) +
                  "</p>\n<p class=\"reason\">" + HtmlEscape(v.reason) + "</p>\n";
  if (!v.compared.empty() || !v.details.empty()) {
    h += "<ul>\n";
    for (const auto* lines : {&v.compared, &v.details})
      for (const std::string& l : *lines) h += "<li>" + HtmlEscape(l) + "</li>\n";
    h += "</ul>\n";
  }
  return h + "</div>\n";
}

std::string SvgVerifyChart(const AlignResult& al, const std::vector<WindowRecord>& a,
                           const std::vector<WindowRecord>& b, const std::string& name_a,
                           const std::string& name_b) {
  constexpr int kW = 760, kH = 300, kLeft = 64, kRight = 20, kTop = 40, kBottom = 46;
  const std::string title = "Verify time per window";
  const std::vector<std::pair<double, double>> pa = VerifyPoints(a), pb = VerifyPoints(b);
  if (pa.empty() && pb.empty())
    return Placeholder(kW, 80, title, "No per-window verify times to plot.");

  const std::size_t n = std::max(a.size(), b.size());
  const double x_span =
      std::max<double>(1.0, static_cast<double>(n) - 1.0);  // a single window still gets an axis
  double y_max = 0.0;
  for (const auto* pts : {&pa, &pb})
    for (const auto& [x, y] : *pts) y_max = std::max(y_max, y);
  const double y_step = NiceStep(y_max > 0.0 ? y_max : 1.0, 5);
  const double y_top = std::max(y_step, std::ceil(y_max / y_step) * y_step);
  const double x_step = std::max(1.0, NiceStep(x_span, 8));
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double i) { return kLeft + pw * i / x_span; };
  auto Y = [&](double ms) { return kTop + ph * (1.0 - ms / y_top); };

  std::string s = fmt::format(
      "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" aria-label=\"{2}\">\n"
      "<title>{2}</title>\n",
      kW, kH, XmlEscape(title));
  // Axes, ticks and grid (linear scale on both axes, starting at zero).
  s += fmt::format("<g font-size=\"11\" fill=\"#333\" stroke-width=\"1\">\n");
  for (double y = 0.0; y <= y_top + y_step * 1e-9; y += y_step) {
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e5e5e5\"/>", kLeft,
                     F(Y(y)), kW - kRight, F(Y(y)));
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 6,
                     F(Y(y) + 4), TickLabel(y, y_step));
  }
  for (double x = 0.0; x <= x_span + 1e-9; x += x_step) {
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#999\"/>", F(X(x)),
                     kH - kBottom, kH - kBottom + 4);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", F(X(x)),
                     kH - kBottom + 16, x);
  }
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#666\"/>", kLeft,
                   kTop, kH - kBottom);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#666\"/>\n", kLeft,
                   kH - kBottom, kW - kRight);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">window index</text>\n",
                   kLeft + pw / 2, kH - 8);
  s += fmt::format(
      "<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {0})\">verify "
      "ms</text>\n</g>\n",
      F(kTop + ph / 2));

  // One polyline per arm (a marker when the arm has a single point).
  const std::array<const std::vector<std::pair<double, double>>*, 2> series = {&pa, &pb};
  const std::array<const std::string*, 2> names = {&name_a, &name_b};
  for (std::size_t k = 0; k < 2; ++k) {
    const auto& pts = *series[k];
    if (pts.size() == 1) {
      s += fmt::format(
          "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"><title>{}</title></circle>\n",
          F(X(pts[0].first)), F(Y(pts[0].second)), kArmColours[k], XmlEscape(*names[k]));
    } else if (!pts.empty()) {
      s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\" points=\"",
                       kArmColours[k]);
      for (const auto& [x, y] : pts) s += F(X(x)) + "," + F(Y(y)) + " ";
      s.back() = '"';
      s += fmt::format("><title>{}</title></polyline>\n", XmlEscape(*names[k]));
    }
  }
  // The first path divergence: windows right of this line are not paired by index.
  if (al.diverged && al.div_idx >= 0 && al.div_idx <= static_cast<int>(x_span)) {
    const double x = X(al.div_idx);
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\" "
        "stroke-dasharray=\"5,4\"/>\n",
        F(x), kTop - 4, kH - kBottom);
    s += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#444\" text-anchor=\"{}\">first path "
        "divergence "
        "(window {})</text>\n",
        F(x + (x > kW / 2 ? -4 : 4)), kTop - 8, x > kW / 2 ? "end" : "start", al.div_idx);
  }
  // Legend.
  for (std::size_t k = 0; k < 2; ++k) {
    const int lx = kLeft + static_cast<int>(k) * 200;
    s += fmt::format(
        "<line x1=\"{}\" y1=\"14\" x2=\"{}\" y2=\"14\" stroke=\"{}\" stroke-width=\"3\"/>", lx,
        lx + 22, kArmColours[k]);
    s += fmt::format("<text x=\"{}\" y=\"18\" font-size=\"12\" fill=\"#222\">{}</text>\n", lx + 28,
                     XmlEscape(*names[k]));
  }
  s += "</svg>\n";
  return s;
}

std::string SvgNrmseHeatmap(const DiffResult& d) {
  const std::string title = "NRMSE per item group and checkpoint";
  if (d.items.empty()) return Placeholder(760, 80, title, "No state items to plot.");
  const HeatmapColumns hc = CollectColumns(d);
  const std::vector<std::string>& cols = hc.names;
  const HeatmapGrid grid = BuildGrid(d, hc);

  const int n_cols = static_cast<int>(cols.size()), n_rows = static_cast<int>(grid.size());
  const int cw = std::clamp(640 / std::max(1, n_cols), 4, 40), ch = 14;
  const bool col_text = cw >= 12;
  const int left = 76, top = col_text ? 70 : 24, legend_h = 70;
  const int width = std::max(700, left + n_cols * cw + 20);  // 700: the legend's width
  const int height = top + n_rows * ch + legend_h;

  std::string s = fmt::format(
      "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" aria-label=\"{2}\">\n"
      "<title>{2}</title>\n<g font-size=\"10\" fill=\"#333\">\n",
      width, height, XmlEscape(title));
  if (col_text) {
    for (int j = 0; j < n_cols; ++j) {
      const double x = left + j * cw + cw / 2.0, y = top - 6;
      s += fmt::format("<text x=\"{0}\" y=\"{1}\" transform=\"rotate(-60 {0} {1})\">{2}</text>\n",
                       F(x), F(y), XmlEscape(hc.labels[static_cast<std::size_t>(j)]));
    }
  } else {
    s += fmt::format("<text x=\"{}\" y=\"16\">{} checkpoints{} (left to right)</text>\n", left,
                     n_cols, hc.truncated ? ", first ones only" : "");
  }
  int row = 0;
  for (const auto& [key, cells] : grid) {
    const int y = top + row * ch;
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 4,
                     y + ch - 3, XmlEscape(RowLabel(key)));
    for (int j = 0; j < n_cols; ++j) {
      auto it = cells.find(static_cast<std::size_t>(j));
      if (it == cells.end()) continue;  // no item of this group at this checkpoint: left blank
      const Cell& c = it->second;
      const auto [fill, what] = CellStyle(c);
      const std::string tip =
          fmt::format("{} @ {}: {} items, {} failed, {} skipped; {}", RowLabel(key),
                      cols[static_cast<std::size_t>(j)], c.n, c.failed, c.skipped, what);
      s += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\" "
          "stroke-width=\"0.5\">"
          "<title>{}</title></rect>\n",
          left + j * cw, y, cw, ch, fill, XmlEscape(tip));
    }
    ++row;
  }
  s += HeatmapLegend(left, top + n_rows * ch + 18);
  s += "</g>\n</svg>\n";
  return s;
}

std::string SvgMedianBandChart(const std::vector<MedianBand>& a, const std::vector<MedianBand>& b,
                               const std::string& name_a, const std::string& name_b,
                               const std::string& title) {
  constexpr int kW = 760, kH = 300, kLeft = 64, kRight = 20, kTop = 40, kBottom = 46;
  const std::size_t n = std::max(a.size(), b.size());
  if (n == 0) return Placeholder(kW, 80, title, "No per-window medians to plot.");
  double y_max = 0.0;
  for (const auto* v : {&a, &b})
    for (const MedianBand& m : *v)
      if (std::isfinite(m.hi95)) y_max = std::max(y_max, m.hi95);
  const double y_step = NiceStep(y_max > 0.0 ? y_max : 1.0, 5);
  const double y_top = std::max(y_step, std::ceil(y_max / y_step) * y_step);
  const double x_span = std::max<double>(1.0, static_cast<double>(n) - 1.0);
  const double x_step = std::max(1.0, NiceStep(x_span, 8));
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double i) { return kLeft + pw * i / x_span; };
  auto Y = [&](double ms) { return kTop + ph * (1.0 - std::clamp(ms, 0.0, y_top) / y_top); };
  std::string s = fmt::format(
      "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" aria-label=\"{2}\">\n"
      "<title>{2}</title>\n<g font-size=\"11\" fill=\"#333\">\n",
      kW, kH, XmlEscape(title));
  for (double y = 0.0; y <= y_top + y_step * 1e-9; y += y_step)
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#e5e5e5\"/><text x=\"{3}\" "
        "y=\"{4}\" text-anchor=\"end\">{5}</text>\n",
        kLeft, F(Y(y)), kW - kRight, kLeft - 6, F(Y(y) + 4), TickLabel(y, y_step));
  for (double x = 0.0; x <= x_span + 1e-9; x += x_step)
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", F(X(x)),
                     kH - kBottom + 16, x);
  s += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#666\"/><line x1=\"{0}\" "
      "y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"#666\"/>\n<text x=\"{4}\" y=\"{5}\" "
      "text-anchor=\"middle\">window index</text>\n<text x=\"14\" y=\"{6}\" "
      "text-anchor=\"middle\" transform=\"rotate(-90 14 {6})\">median verify ms (band: "
      "95%)</text>\n</g>\n",
      kLeft, kTop, kH - kBottom, kW - kRight, kLeft + pw / 2, kH - 8, F(kTop + ph / 2));
  const std::array<const std::vector<MedianBand>*, 2> series = {&a, &b};
  const std::array<const std::string*, 2> names = {&name_a, &name_b};
  for (std::size_t k = 0; k < 2; ++k) {
    const auto& v = *series[k];
    if (v.empty()) continue;
    std::string band, line;
    for (std::size_t i = 0; i < v.size(); ++i)
      band += F(X(static_cast<double>(i))) + "," + F(Y(v[i].hi95)) + " ";
    for (std::size_t i = v.size(); i-- > 0;)
      band += F(X(static_cast<double>(i))) + "," + F(Y(v[i].lo95)) + " ";
    for (std::size_t i = 0; i < v.size(); ++i)
      line += F(X(static_cast<double>(i))) + "," + F(Y(v[i].median)) + " ";
    band.pop_back();
    line.pop_back();
    s += fmt::format(
        "<polygon points=\"{}\" fill=\"{}\" fill-opacity=\"0.15\" stroke=\"none\"/>\n"
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" points=\"{}\"><title>{} "
        "median</title></polyline>\n",
        band, kArmColours[k], kArmColours[k], line, XmlEscape(*names[k]));
    const int lx = kLeft + static_cast<int>(k) * 200;
    s += fmt::format(
        "<line x1=\"{}\" y1=\"14\" x2=\"{}\" y2=\"14\" stroke=\"{}\" stroke-width=\"3\"/>"
        "<text x=\"{}\" y=\"18\" font-size=\"12\" fill=\"#222\">{} (median, 95% band)</text>\n",
        lx, lx + 22, kArmColours[k], lx + 28, XmlEscape(*names[k]));
  }
  return s + "</svg>\n";
}

}  // namespace lockstep
