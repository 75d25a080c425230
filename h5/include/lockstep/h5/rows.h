// The row layouts of a lockstep.export file's tables (instrument/SCHEMA.md) and their HDF5
// compound types: written by the exporter (instrument/export_writer.cpp) and read by the export
// reader (compare/), from this one definition.
//
//   /index/items          IndexRow           IndexRowType()
//   /trace/windows        TraceWindowRow     kTraceWindowFields
//   /trace/stages         TraceStageRow      kTraceStageFields
//   /trace/steps          TraceStepRow       kTraceStepFields
//   /trace/window_steps   TraceWindowStepRow kTraceWindowStepFields
//   /trace/samples        HostSampleRow      kHostSampleFields
//   /trace/device_samples DeviceSampleRow    kDeviceSampleFields
//   /ops/records          OpRecordRow        kOpRecordFields
//
// The file's bytes are these structs as they are (one H5Dwrite of the row vector), so changing a
// struct, a field's type or the order of a table changes the file format: bump schema_version.
// Readers match compound members by NAME (HDF5 converts by name), so a reader of these tables
// takes the names from the tables below and accepts the fields in any order. The trace tables'
// field names are WindowRecord's / StageTiming's (engine window.h). Pure functions; the types
// returned are new HDF5 handles owned by the caller (single-threaded HDF5, see handle.h).
#pragma once

#include <hdf5.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "lockstep/h5/handle.h"

namespace lockstep {

// ---- /index/items ----

// One row of /index/items: where an item's bytes are and what they are, so a reader can locate
// every item from one table instead of opening thousands of HDF5 objects. Strings are
// NUL-terminated (truncated to fit); dims beyond `rank` are 0.
struct IndexRow {
  char checkpoint[32];  // "00001_commit"
  char rel[64];         // "stage1/layer3/k"
  char kind[16];        // ItemKindName
  char dtype[8];        // dtype_name: "f32" | "bf16" | "int8"
  std::int32_t stage, layer, rank, pad;
  std::int64_t dims[4];
  std::int64_t valid_rows, capacity_rows;
  std::int64_t offset;        // file offset of the contiguous data (-1: no storage, e.g. 0 rows)
  std::int64_t scale_offset;  // int8: offset of `<item>_scale` f32 [rows, heads] (-1: none)
  std::int64_t scale_dims[2];
};

// The compound type of IndexRow (file and memory type alike: little-endian integers, fixed-size
// NUL-terminated strings, int64 arrays; `pad` is not a member). Invalid handle when HDF5 fails.
inline H5Handle IndexRowType() {
  H5Handle t(H5Tcreate(H5T_COMPOUND, sizeof(IndexRow)));
  auto str = [](std::size_t n) {
    H5Handle st(H5Tcopy(H5T_C_S1));
    H5Tset_size(st.get(), n);
    H5Tset_strpad(st.get(), H5T_STR_NULLTERM);
    return st;
  };
  const hsize_t four = 4, two = 2;
  H5Handle s32 = str(32), s64 = str(64), s16 = str(16), s8 = str(8);
  H5Handle d4(H5Tarray_create2(H5T_STD_I64LE, 1, &four));
  H5Handle d2(H5Tarray_create2(H5T_STD_I64LE, 1, &two));
  const bool ok =
      t.valid() &&
      H5Tinsert(t.get(), "checkpoint", HOFFSET(IndexRow, checkpoint), s32.get()) >= 0 &&
      H5Tinsert(t.get(), "rel", HOFFSET(IndexRow, rel), s64.get()) >= 0 &&
      H5Tinsert(t.get(), "kind", HOFFSET(IndexRow, kind), s16.get()) >= 0 &&
      H5Tinsert(t.get(), "dtype", HOFFSET(IndexRow, dtype), s8.get()) >= 0 &&
      H5Tinsert(t.get(), "stage", HOFFSET(IndexRow, stage), H5T_STD_I32LE) >= 0 &&
      H5Tinsert(t.get(), "layer", HOFFSET(IndexRow, layer), H5T_STD_I32LE) >= 0 &&
      H5Tinsert(t.get(), "rank", HOFFSET(IndexRow, rank), H5T_STD_I32LE) >= 0 &&
      H5Tinsert(t.get(), "dims", HOFFSET(IndexRow, dims), d4.get()) >= 0 &&
      H5Tinsert(t.get(), "valid_rows", HOFFSET(IndexRow, valid_rows), H5T_STD_I64LE) >= 0 &&
      H5Tinsert(t.get(), "capacity_rows", HOFFSET(IndexRow, capacity_rows), H5T_STD_I64LE) >= 0 &&
      H5Tinsert(t.get(), "offset", HOFFSET(IndexRow, offset), H5T_STD_I64LE) >= 0 &&
      H5Tinsert(t.get(), "scale_offset", HOFFSET(IndexRow, scale_offset), H5T_STD_I64LE) >= 0 &&
      H5Tinsert(t.get(), "scale_dims", HOFFSET(IndexRow, scale_dims), d2.get()) >= 0;
  return ok ? std::move(t) : H5Handle();
}

// ---- integer tables: a field list per row struct ----

// The element type of one member of an integer table.
enum class RowFieldType : std::uint8_t { kU8, kI32, kI64 };

struct RowField {
  const char* name;
  std::size_t offset;  // in the row struct
  RowFieldType type;
};

// The native HDF5 type of a member (predefined: never closed).
inline hid_t RowFieldH5Type(RowFieldType t) {
  switch (t) {
    case RowFieldType::kU8:
      return H5T_NATIVE_UINT8;
    case RowFieldType::kI32:
      return H5T_NATIVE_INT32;
    case RowFieldType::kI64:
      break;
  }
  return H5T_NATIVE_INT64;
}

// Index of the field called `name` in `fields`; fields.size() when there is none (a constant
// expression: a reader that names a field the table lacks fails to compile where it is used as
// one, e.g. through RowCol).
template <std::size_t N>
constexpr std::size_t RowFieldIndex(const std::array<RowField, N>& fields, std::string_view name) {
  for (std::size_t i = 0; i < N; ++i)
    if (name == fields[i].name) return i;
  return N;
}

// Stores `v` into field `f` of the row struct at `row`, narrowed to the field's type (callers
// range-check first).
inline void SetRowField(void* row, const RowField& f, std::int64_t v) {
  auto* at = static_cast<unsigned char*>(row) + f.offset;
  if (f.type == RowFieldType::kU8) {
    const auto x = static_cast<std::uint8_t>(v);
    std::memcpy(at, &x, sizeof(x));
  } else if (f.type == RowFieldType::kI32) {
    const auto x = static_cast<std::int32_t>(v);
    std::memcpy(at, &x, sizeof(x));
  } else {
    std::memcpy(at, &v, sizeof(v));
  }
}

// The compound type of a row struct of `size` bytes holding `fields` (inserted in table order).
// Invalid handle when HDF5 fails.
template <std::size_t N>
H5Handle RowType(std::size_t size, const std::array<RowField, N>& fields) {
  H5Handle t(H5Tcreate(H5T_COMPOUND, size));
  if (!t.valid()) return t;
  for (const RowField& f : fields)
    if (H5Tinsert(t.get(), f.name, f.offset, RowFieldH5Type(f.type)) < 0) return H5Handle();
  return t;
}

// One row of /trace/windows: WindowRecord's path and timing fields, each column named as its
// WindowField (window.h; draft, emitted, source and the per-stage timings are not in it; source
// follows from T, merged and from_sfx).
struct TraceWindowRow {
  std::int32_t idx, p, T, T_mtp;
  std::uint8_t merged, from_sfx, first_call, pad0;
  std::int32_t chain_n, accepted;
  std::int64_t begin_ns, end_ns, verify_ns, wait_ns, compute_ns, draft_ns, commit_ns, export_ns;
};

#define LOCKSTEP_ROW_FIELD_(Row, name, type) \
  RowField { #name, offsetof(Row, name), RowFieldType::type }
inline constexpr std::array<RowField, 17> kTraceWindowFields = {
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, idx, kI32),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, p, kI32),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, T, kI32),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, T_mtp, kI32),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, merged, kU8),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, from_sfx, kU8),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, first_call, kU8),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, chain_n, kI32),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, accepted, kI32),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, begin_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, end_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, verify_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, wait_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, compute_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, draft_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, commit_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceWindowRow, export_ns, kI64),
};

// One row of /trace/stages: a window's per-stage timing (WindowRecord::stages, StageTiming), rows
// in (window, stage) order. graph: GraphUse + 1 (0 none, 1 eager, 2 capture, 3 replay).
struct TraceStageRow {
  std::int32_t window, stage;
  std::int64_t wait_ns, compute_ns, cpu_ns, dev_wait_ns, dev_compute_ns, dev_copy_ns, init_ns;
  std::uint8_t graph, pad[7];
};

inline constexpr std::array<RowField, 10> kTraceStageFields = {
    LOCKSTEP_ROW_FIELD_(TraceStageRow, window, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, stage, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, wait_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, compute_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, cpu_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, dev_wait_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, dev_compute_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, dev_copy_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, init_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStageRow, graph, kU8),
};

// One row of /trace/steps: one engine step the request had rows in (StepRecord, engine
// step_record.h, without its slot list), rows in step order.
struct TraceStepRow {
  std::int64_t step, begin_ns, end_ns;
  std::int32_t rows, seqs, verify_rows, prefill_rows, queue_depth, live;
  std::int64_t weight_bytes, flops;
};

inline constexpr std::array<RowField, 11> kTraceStepFields = {
    LOCKSTEP_ROW_FIELD_(TraceStepRow, step, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, begin_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, end_ns, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, rows, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, seqs, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, verify_rows, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, prefill_rows, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, queue_depth, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, live, kI32),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, weight_bytes, kI64),
    LOCKSTEP_ROW_FIELD_(TraceStepRow, flops, kI64),
};

// One row of /trace/window_steps: the engine step a verify window ran in, rows in window order
// (one per row of /trace/windows).
struct TraceWindowStepRow {
  std::int32_t window, pad;
  std::int64_t step;
};

inline constexpr std::array<RowField, 2> kTraceWindowStepFields = {
    LOCKSTEP_ROW_FIELD_(TraceWindowStepRow, window, kI32),
    LOCKSTEP_ROW_FIELD_(TraceWindowStepRow, step, kI64),
};

// One row of /trace/samples: a host resource sample (-1 in any field: not measured).
struct HostSampleRow {
  std::int64_t t_ns, host_available_bytes, swap_used_bytes, rss_bytes, process_cpu_ns;
};

inline constexpr std::array<RowField, 5> kHostSampleFields = {
    LOCKSTEP_ROW_FIELD_(HostSampleRow, t_ns, kI64),
    LOCKSTEP_ROW_FIELD_(HostSampleRow, host_available_bytes, kI64),
    LOCKSTEP_ROW_FIELD_(HostSampleRow, swap_used_bytes, kI64),
    LOCKSTEP_ROW_FIELD_(HostSampleRow, rss_bytes, kI64),
    LOCKSTEP_ROW_FIELD_(HostSampleRow, process_cpu_ns, kI64),
};

// One row of /trace/device_samples: one device in one sample (-1 in any field: not measured).
struct DeviceSampleRow {
  std::int64_t t_ns;
  std::int32_t device;
  std::int64_t free_bytes, total_bytes;
  std::int32_t temperature_c, sm_clock_mhz, pcie_gen, pcie_width;
};

inline constexpr std::array<RowField, 8> kDeviceSampleFields = {
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, t_ns, kI64),
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, device, kI32),
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, free_bytes, kI64),
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, total_bytes, kI64),
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, temperature_c, kI32),
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, sm_clock_mhz, kI32),
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, pcie_gen, kI32),
    LOCKSTEP_ROW_FIELD_(DeviceSampleRow, pcie_width, kI32),
};
// One row of /ops/records (issue 37): one output row of one named op, or one state read, in
// execution order. `op` indexes /ops/table; `digest` is the 64-bit row digest's bits; dump_offset
// is the row's first float in /ops/dump (-1: not dumped), dump_len its floats.
struct OpRecordRow {
  std::int32_t window, stage, layer, op, index, position, row, pad;
  std::int64_t digest, dump_offset, dump_len;
};

inline constexpr std::array<RowField, 10> kOpRecordFields = {
    LOCKSTEP_ROW_FIELD_(OpRecordRow, window, kI32),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, stage, kI32),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, layer, kI32),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, op, kI32),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, index, kI32),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, position, kI32),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, row, kI32),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, digest, kI64),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, dump_offset, kI64),
    LOCKSTEP_ROW_FIELD_(OpRecordRow, dump_len, kI64),
};
#undef LOCKSTEP_ROW_FIELD_

}  // namespace lockstep
