// ExportQuota: the byte budget of one export (lockstep serve's --max-export-mib). An export of
// every window of a long request is hundreds of MB (a 760-token request: 691 MB in 5.5 s), so the
// budget is enforced twice:
// - by projection, at the end of the first exported checkpoint: its bytes times the number of
//   checkpoints the request can still export (its window selection and points, up to the most
//   windows it can run). K/V grows window by window, so the projection is a floor of what
//   exporting every selected window would take; over the budget, the export stops there;
// - as a hard stop: a state item that would take the export past the budget is not copied, and
//   nothing after it is.
// Bytes are the uncompressed bytes of the state items (what the exporter copies and hands to
// HDF5; LZ4 may store fewer). Once over, the export is abandoned: H5Exporter::Finish removes the
// `.partial` file and returns Error(). Used from the engine's driver thread only; over() may be
// read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "lockstep/engine/status.h"
#include "lockstep/engine/window_selection.h"

namespace lockstep {

class ExportQuota {
 public:
  // `max_bytes` 0: no budget. `max_windows` 0: unknown (no projection). `points`: how many
  // checkpoints each selected window exports.
  ExportQuota(std::uint64_t max_bytes, int max_windows, const WindowSelection& windows, int points);

  // Counts `bytes` more of window `window`; false (and over() from then on) when they would take
  // the export past the budget.
  bool Take(std::uint64_t bytes, int window);
  // After each exported checkpoint (the first one projects the whole export).
  void EndCheckpoint(int window);

  bool over() const { return over_.load(std::memory_order_relaxed); }
  std::uint64_t taken() const { return taken_; }
  // kInvalidArgument naming the budget, what would have passed it and where.
  Status Error() const;

 private:
  void Stop(std::string why);

  std::uint64_t max_bytes_;
  int max_windows_;
  WindowSelection windows_;
  int points_;
  std::uint64_t taken_ = 0, in_checkpoint_ = 0;
  bool projected_ = false;
  std::atomic<bool> over_{false};
  std::string why_;
};

}  // namespace lockstep
