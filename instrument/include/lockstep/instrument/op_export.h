// Op digests in an export (issue 37): which windows record them (--op-digests), which ops' rows
// are stored in full (--op-dump), and the collector the exporter fills from Observer::OnOp.
//
// Export layout (instrument/SCHEMA.md "/ops"; absent when --op-digests is none, so such a file
// is the file it always was):
//   /ops/table    fixed-length strings [n_ops]: one JSON object per op name used, {"name",
//                 "inputs": [...], "state": bool}; /ops/records' `op` indexes it
//   /ops/records  compound [n_records] (h5 rows.h OpRecordRow), execution order
//   /ops/l2       f64 [n_records]: each record's row L2 norm (-1: a state read)
//   /ops/dump     f32 [n_dump_floats]: dumped rows back to back (only with --op-dump)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/op_table.h"
#include "lockstep/engine/status.h"
#include "lockstep/engine/window_selection.h"

namespace lockstep {

// The export paths of the op tables are kOps*Path in h5/paths.h (the writer's and the reader's).

// "none" | "all" (every verify window and the prefill) | a comma list of window indices, ranges
// ("24-26") and `prefill`. kInvalidArgument labelled with `option` for anything else.
class OpWindows {
 public:
  static Result<OpWindows> Parse(std::string_view text, std::string_view option = "--op-digests");
  // window -1 = the prefill.
  bool Contains(int window) const { return window < 0 ? prefill_ : windows_.Contains(window); }
  bool none() const { return !prefill_ && windows_.none(); }

 private:
  WindowSelection windows_;
  bool prefill_ = false;
};

// --op-dump OPS@WINDOWS: OPS a comma list of op names (or `all`), WINDOWS as OpWindows.
struct OpDump {
  std::vector<std::string> ops;  // empty: every op
  OpWindows windows;
  static Result<OpDump> Parse(std::string_view text);
  bool Wants(std::string_view op, int window) const;
};

// Collects op records (the exporter's OnOp) and writes them (WriteOps, export_writer.cpp).
class OpCollector {
 public:
  void Add(const OpRecord& rec, bool dump);
  bool empty() const { return records_.empty(); }

  struct Record {
    int window, stage, layer, op, index, position, row;
    std::uint64_t digest;
    double l2;
    std::int64_t dump_offset, dump_len;
  };
  const std::vector<Record>& records() const { return records_; }
  const std::vector<const OpDef*>& ops() const { return ops_; }
  const std::vector<float>& dump() const { return dump_; }

 private:
  std::vector<Record> records_;
  std::vector<const OpDef*> ops_;        // /ops/table order
  std::map<std::string, int> op_index_;  // name -> index in ops_
  std::vector<float> dump_;
};

// The JSON object of one /ops/table entry.
std::string OpTableEntryJson(const OpDef& def);

}  // namespace lockstep
