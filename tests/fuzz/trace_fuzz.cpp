// libFuzzer target: arbitrary bytes -> WindowRecord::FromJsonLine per line -> AlignWindows.
//
// The contracts under test (engine/include/lockstep/engine/window.h,
// compare/include/lockstep/compare/align.h): every line either parses into a record whose T,
// draft, accepted and emitted agree, or yields a kInvalidArgument Status with a message; a parsed
// record survives ToJsonLine -> FromJsonLine unchanged; aligning any two parsed traces keeps its
// size invariants (matched prefix, per-side rests, timing only over the prefix). Never a crash, a
// hang, undefined behaviour or an allocation out of proportion to the input. The first line also
// goes through ParseAlignFields and, when valid, chooses the aligned fields, so the field list is
// fuzzed together with the traces. Built only with clang (see CMakeLists.txt here); run e.g.
// `./trace_fuzz -max_total_time=60 -max_len=4096 corpus/trace/`.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/align.h"
#include "lockstep/engine/window.h"

namespace {

void Require(bool cond) {
  if (!cond) std::abort();
}

void CheckRecord(const lockstep::WindowRecord& r) {
  Require(r.T >= 1 && r.p >= 0);
  Require(r.draft.size() == static_cast<std::size_t>(r.T - 1));
  Require(r.accepted >= 0 && r.accepted <= r.T - 1);
  Require(r.emitted.size() == static_cast<std::size_t>(r.accepted) + 1);
  // What the engine writes it must read back unchanged.
  lockstep::Result<lockstep::WindowRecord> back =
      lockstep::WindowRecord::FromJsonLine(r.ToJsonLine(), "roundtrip");
  Require(back.ok());
  Require(back->SamePath(r));
  Require(back->begin_ns == r.begin_ns && back->end_ns == r.end_ns &&
          back->draft_ns == r.draft_ns && back->verify_ns == r.verify_ns &&
          back->wait_ns == r.wait_ns && back->compute_ns == r.compute_ns &&
          back->commit_ns == r.commit_ns && back->first_call == r.first_call);
  // -1 and any other negative value both mean "not measured" once written (as null).
  Require(back->export_ns == (r.export_ns >= 0 ? r.export_ns : -1));
  Require(back->stages.size() == r.stages.size());
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    const lockstep::StageTiming &x = r.stages[i], &y = back->stages[i];
    Require(x.wait_ns == y.wait_ns && x.compute_ns == y.compute_ns && x.cpu_ns == y.cpu_ns);
    Require(x.dev_wait_ns == y.dev_wait_ns && x.dev_compute_ns == y.dev_compute_ns &&
            x.dev_copy_ns == y.dev_copy_ns && x.init_ns == y.init_ns && x.graph == y.graph);
  }
}

void CheckAlign(const std::vector<lockstep::WindowRecord>& a,
                const std::vector<lockstep::WindowRecord>& b, const lockstep::AlignOptions& opts) {
  const lockstep::AlignResult r = lockstep::AlignWindows(a, b, opts);
  Require(r.n_a == static_cast<int>(a.size()) && r.n_b == static_cast<int>(b.size()));
  Require(r.matched >= 0 && r.matched <= r.n_a && r.matched <= r.n_b);
  if (r.diverged) {
    Require(r.div_idx == r.matched);
    Require(r.div_a.has_value() == (r.matched < r.n_a) &&
            r.div_b.has_value() == (r.matched < r.n_b));
    Require(r.differing_fields.empty() == !(r.div_a && r.div_b));
    Require(r.rest_a.size() == a.size() - static_cast<std::size_t>(r.matched));
    Require(r.rest_b.size() == b.size() - static_cast<std::size_t>(r.matched));
    if (r.div_a) (void)lockstep::DescribeWindow(*r.div_a, r.fields);
    if (r.div_b) (void)lockstep::DescribeWindow(*r.div_b, r.fields);
  } else {
    Require(r.div_idx == -1 && r.matched == r.n_a && r.n_a == r.n_b);
    Require(r.rest_a.empty() && r.rest_b.empty() && r.differing_fields.empty());
  }
  // The host intervals always; the device ones too when either side has device stage timings.
  const std::size_t n_host = lockstep::TimingIntervals().size();
  Require(r.timing.size() == n_host ||
          r.timing.size() == n_host + lockstep::DeviceTimingIntervals().size());
  for (const lockstep::IntervalDiff& d : r.timing) {
    Require(d.delta_ms.size() == (d.known ? static_cast<std::size_t>(r.matched) : 0));
    Require(d.max_at < r.matched && (d.max_at >= 0) == !d.delta_ms.empty());
  }
  for (const auto* notable : {&r.notable_a, &r.notable_b}) {
    Require(notable->size() <= static_cast<std::size_t>(opts.max_notable));
    for (std::size_t i = 1; i < notable->size(); ++i)
      Require((*notable)[i - 1].verify_ms >= (*notable)[i].verify_ms);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<lockstep::WindowRecord> records;
  lockstep::AlignOptions opts;
  std::size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    if (first) {
      first = false;
      lockstep::Result<std::vector<std::string>> fields = lockstep::ParseAlignFields(line);
      if (fields.ok()) {
        opts.fields = *fields;
      } else {
        Require(fields.status().code() == lockstep::Status::Code::kInvalidArgument);
      }
    }
    lockstep::Result<lockstep::WindowRecord> r =
        lockstep::WindowRecord::FromJsonLine(line, "fuzz-input");
    if (r.ok()) {
      CheckRecord(*r);
      records.push_back(std::move(*r));
    } else {
      // Malformed input is reported as invalid, with a message; never another code.
      Require(r.status().code() == lockstep::Status::Code::kInvalidArgument &&
              !r.status().message().empty());
    }
    start = end + 1;
  }
  if (records.size() >= 2) {
    const auto mid = records.begin() + static_cast<std::ptrdiff_t>(records.size() / 2);
    const std::vector<lockstep::WindowRecord> a(records.begin(), mid), b(mid, records.end());
    CheckAlign(a, b, opts);
    CheckAlign(b, a, opts);
    CheckAlign(a, a, opts);
  }
  return 0;
}
