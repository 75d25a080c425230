// StepRecord: what one engine step carried (continuous batching, engine/serve). The scheduler
// keeps one per step; each window record names its step, and exports of a request hold the
// records of the steps it took part in (/trace/steps, instrument/SCHEMA.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

struct StepRecord {
  std::int64_t step = 0;      // engine step counter, from 0 per engine
  std::int64_t begin_ns = 0;  // CLOCK_MONOTONIC around the step's forward
  std::int64_t end_ns = 0;
  int rows = 0;                    // rows through the stages
  int seqs = 0;                    // sequences (row groups)
  int verify_rows = 0;             // rows of verify windows
  int prefill_rows = 0;            // rows of prefill chunks
  int queue_depth = 0;             // requests waiting for a slot after admission
  int live = 0;                    // sequences holding a slot
  std::uint64_t weight_bytes = 0;  // weight bytes the step's products read (stage.h StepWork)
  std::uint64_t flops = 0;         // multiply-adds x 2 of the step's products (StepWork)
  std::vector<int> slots;          // slot of each group, plan order
  // The step's row groups in plan order (stage.h RowGroup without row0: rows are contiguous).
  struct Group {
    int slot = 0;
    bool verify = false;  // a verify window; false: a prefill chunk
    int p = 0;            // position of its first row
    int T = 0;            // rows
  };
  std::vector<Group> groups;
  // One JSON object, schema "lockstep.step" v1, without a trailing newline.
  std::string ToJsonLine() const;
};

}  // namespace lockstep
