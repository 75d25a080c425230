// The row counts at which the CPU backend's kernels change their blocking (issue 40's sweep):
// a sweep that wants to find a batch-size cliff on this backend runs prefill chunks (and steps)
// whose row counts straddle each of them. Read from the kernels' own constants
// (engine/cpu/tiles.cpp), so the list follows a kernel that changes its tiles.
#pragma once

#include <string>
#include <vector>

namespace lockstep {

struct RowTile {
  std::string name;   // "invariant_rows", "gemm_panel", "gemm_tile", "gdn_chunk", "gemv"
  int rows = 0;       // the boundary: blocks of this many rows
  std::string where;  // the kernel, one line
};

// In increasing rows (duplicates kept: two kernels may share a boundary).
std::vector<RowTile> CpuRowTiles();

// Row counts that straddle every boundary of `tiles` (b - 1, b, b + 1 for each, 1 for the
// matrix-vector path), sorted, unique, each >= 1.
std::vector<int> StraddlingRows(const std::vector<RowTile>& tiles);

}  // namespace lockstep
