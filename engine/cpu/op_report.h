// How the CPU kernels report their ops (op_table.h): a thread-local tap that the stage session
// installs around a forward when the engine gave it a sink. Kernels call ReportOp / ReportState
// from the thread that runs the stage (never from pool workers), after the op's output is
// complete and before anything reads it; with no tap installed each call is one branch.
#pragma once

#include <cstddef>
#include <utility>

#include "lockstep/engine/op_table.h"

namespace lockstep::cpu {

struct OpTap {
  OpSink* sink = nullptr;
  int stage = 0;
  int layer = -1;  // set per layer by the stage
  int row0 = 0;    // first step row of the rows the kernel works on (a part of the step)
};

// The tap of this thread (null: reporting off).
inline OpTap*& CurrentOpTap() {
  static thread_local OpTap* tap = nullptr;
  return tap;
}

// Installs a tap for `sink` (nothing when sink is null) for the scope's life; restores the
// previous one after.
class OpTapScope {
 public:
  OpTapScope(OpSink* sink, int stage) : prev_(CurrentOpTap()) {
    if (sink != nullptr) {
      tap_ = OpTap{sink, stage, -1, 0};
      CurrentOpTap() = &tap_;
    }
  }
  ~OpTapScope() { CurrentOpTap() = prev_; }
  OpTapScope(const OpTapScope&) = delete;
  OpTapScope& operator=(const OpTapScope&) = delete;

 private:
  OpTap tap_;
  OpTap* prev_;
};

// Sets the tap's layer / row base when a tap is installed.
inline void SetOpLayer(int layer) {
  if (OpTap* t = CurrentOpTap()) t->layer = layer;
}
inline void SetOpRow0(int row0) {
  if (OpTap* t = CurrentOpTap()) t->row0 = row0;
}
inline int OpRow0() {
  const OpTap* t = CurrentOpTap();
  return t ? t->row0 : 0;
}

// Rows [row, row + n_rows) of the kernel's rows (relative to the tap's row base): `width` floats
// each, `stride` floats apart (0: = width).
inline void ReportOp(OpId op, float* data, int row, int n_rows, std::size_t width,
                     std::size_t stride = 0, int index = -1) {
  OpTap* t = CurrentOpTap();
  if (t == nullptr) return;
  OpRows r;
  r.def = &GetOpDef(op);
  r.stage = t->stage, r.layer = t->layer, r.index = index;
  r.row0 = t->row0 + row, r.n_rows = n_rows;
  r.width = width, r.stride = stride == 0 ? width : stride;
  r.data = data;
  t->sink->OnOp(r);
}

// A state item read by the sequence whose first row is kernel row `row`.
template <class RowFn>
inline void ReportState(OpId op, int row, int n_rows, std::size_t row_bytes, RowFn&& fn) {
  OpTap* t = CurrentOpTap();
  if (t == nullptr) return;
  OpStateRead s;
  s.def = &GetOpDef(op);
  s.stage = t->stage, s.layer = t->layer;
  s.row0 = t->row0 + row, s.n_rows = n_rows, s.row_bytes = row_bytes;
  s.row = std::forward<RowFn>(fn);
  t->sink->OnStateRead(s);
}

}  // namespace lockstep::cpu
