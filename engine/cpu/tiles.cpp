// CpuRowTiles (lockstep/engine/cpu_tiles.h) from the kernels' constants.
#include <algorithm>

#include "cpu/gdn.h"
#include "cpu/gemm.h"
#include "cpu/matmul.h"
#include "lockstep/engine/cpu_tiles.h"

namespace lockstep {

std::vector<RowTile> CpuRowTiles() {
  std::vector<RowTile> t = {
      {"gemv", 1, "prefill GEMM: T == 1 is the matrix-vector product (gemm.h)"},
      {"invariant_rows", cpu::InvariantRowBlock(),
       "batch-invariant products: x rows in DotRows blocks (matmul.cpp kMaxRows)"},
      {"gemm_panel", cpu::GemmColumnPanel(),
       "prefill GEMM: Eigen's 4-column rhs panels, the last T % 4 one by one (gemm.cpp)"},
      {"gemm_tile", cpu::GemmColumnTile(),
       "prefill GEMM: the own kernel's tile of 4 x kPanelsPerTile columns (gemm.cpp)"},
      {"gdn_chunk", cpu::kGdnPrefillChunk,
       "GDN prefill: the chunked form's blocks of tokens (gdn.h kGdnPrefillChunk)"},
  };
  std::stable_sort(t.begin(), t.end(),
                   [](const RowTile& a, const RowTile& b) { return a.rows < b.rows; });
  return t;
}

std::vector<int> StraddlingRows(const std::vector<RowTile>& tiles) {
  std::vector<int> rows;
  for (const RowTile& t : tiles)
    for (int r : {t.rows - 1, t.rows, t.rows + 1})
      if (r >= 1) rows.push_back(r);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

}  // namespace lockstep
