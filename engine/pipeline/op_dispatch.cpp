#include "pipeline/op_dispatch.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string_view>

namespace lockstep {

float AddUlps(float x, int ulps) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  return std::bit_cast<float>(bits + static_cast<std::uint32_t>(ulps));
}

namespace {

// The row's first element of the largest magnitude.
std::size_t LargestElement(const float* row, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (std::fabs(row[i]) > std::fabs(row[best])) best = i;
  return best;
}

}  // namespace

void OpDispatch::OnOp(const OpRows& r) {
  for (Group& g : groups_) {
    const int b = std::max(r.row0, g.row0), e = std::min(r.row0 + r.n_rows, g.row0 + g.T);
    if (b >= e) continue;
    for (int row = b; row < e; ++row) {
      float* x = r.data + static_cast<std::size_t>(row - r.row0) * r.stride;
      const int in_group = row - g.row0;
      for (std::size_t i = 0; i < g.inj.size(); ++i) {
        const Injection& inj = *g.inj[i];
        InjectionRecord& rec = *g.records[i];
        if (inj.window != g.window || inj.layer != r.layer || inj.row != in_group ||
            (inj.stage >= 0 && inj.stage != r.stage) || std::string_view(r.def->name) != inj.op)
          continue;
        if (!rec.firings.empty() && rec.firings.back().window == g.window) continue;  // once
        const std::size_t el = LargestElement(x, r.width);
        x[el] = AddUlps(x[el], inj.ulps);
        InjectionFiring f;
        f.window = g.window, f.stage = r.stage, f.layer = r.layer, f.p = g.p, f.T = g.T;
        f.factor = static_cast<double>(inj.ulps);
        f.row = in_group, f.position = g.p + in_group, f.element = static_cast<int>(el);
        rec.Add(f);
      }
      if (g.obs == nullptr) continue;
      OpRecord rec;
      rec.def = r.def;
      rec.window = g.window;
      rec.stage = r.stage, rec.layer = r.layer, rec.index = r.index;
      rec.position = g.p + in_group;
      rec.row = in_group;
      rec.digest = RowDigest(x, r.width * sizeof(float));
      rec.l2 = RowL2(x, r.width);
      rec.data = x;
      rec.width = r.width;
      g.obs->OnOp(rec);
    }
  }
}

void OpDispatch::OnStateRead(const OpStateRead& s) {
  for (Group& g : groups_) {
    if (g.obs == nullptr || s.row0 < g.row0 || s.row0 >= g.row0 + g.T) continue;
    std::uint64_t h = RowDigest(nullptr, 0);
    for (int u = 0; u < s.n_rows; ++u) h = RowDigestAppend(h, s.row(u), s.row_bytes);
    OpRecord rec;
    rec.def = s.def;
    rec.window = g.window;
    rec.stage = s.stage, rec.layer = s.layer;
    rec.position = g.p + (s.row0 - g.row0);
    rec.row = -1;
    rec.digest = h;
    rec.l2 = -1.0;  // not computed for state reads
    g.obs->OnOp(rec);
  }
}

}  // namespace lockstep
