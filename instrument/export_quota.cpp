#include "lockstep/instrument/export_quota.h"

#include <fmt/format.h>

#include <utility>

namespace lockstep {

namespace {
std::string Mib(std::uint64_t bytes) {
  if (bytes < (std::uint64_t{1} << 20))
    return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024.0);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}
}  // namespace

ExportQuota::ExportQuota(std::uint64_t max_bytes, int max_windows, const WindowSelection& windows,
                         int points)
    : max_bytes_(max_bytes), max_windows_(max_windows), windows_(windows), points_(points) {}

void ExportQuota::Stop(std::string why) {
  why_ = std::move(why);
  over_.store(true, std::memory_order_relaxed);
}

bool ExportQuota::Take(std::uint64_t bytes, int window) {
  if (over()) return false;
  if (max_bytes_ != 0 && taken_ + bytes > max_bytes_) {
    Stop(fmt::format("window {} would take it to {}", window, Mib(taken_ + bytes)));
    return false;
  }
  taken_ += bytes;
  in_checkpoint_ += bytes;
  return true;
}

void ExportQuota::EndCheckpoint(int window) {
  const std::uint64_t one = in_checkpoint_;
  in_checkpoint_ = 0;
  if (projected_ || over() || max_bytes_ == 0 || max_windows_ <= 0) return;
  projected_ = true;
  // Checkpoints still to come (a floor): every selected window after this one, up to the most
  // the request can run, at each exported point.
  std::uint64_t left = 0;
  for (int w = window + 1; w < max_windows_; ++w) left += windows_.Contains(w) ? points_ : 0;
  const std::uint64_t projected = taken_ + one * left;
  if (projected > max_bytes_)
    Stop(
        fmt::format("its first checkpoint took {}, and the {} more it selects would take at "
                    "least {} in all",
                    Mib(one), left, Mib(projected)));
}

Status ExportQuota::Error() const {
  return Status::InvalidArgument(fmt::format(
      "the export would pass --max-export-mib ({}): {}; export fewer windows (lockstep.export "
      "windows, e.g. \"0-3\"), fewer points, or raise the limit; nothing was kept",
      Mib(max_bytes_), why_));
}

}  // namespace lockstep
