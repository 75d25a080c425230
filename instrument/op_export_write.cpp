// Writes the op tables of an export (op_export.h, instrument/SCHEMA.md "/ops").
#include <cstring>

#include "export_h5.h"
#include "lockstep/h5/paths.h"
#include "lockstep/h5/rows.h"

namespace lockstep {

namespace {

// A 1-D dataset of n numbers of file type `file_t` from memory of type `mem_t`.
Status WriteNumbers(hid_t file, hid_t lcpl, const char* path, hid_t file_t, hid_t mem_t,
                    const void* data, std::size_t n) {
  const hsize_t dims = n;
  H5Handle sp(H5Screate_simple(1, &dims, nullptr));
  H5Handle ds(H5Dcreate2(file, path, file_t, sp.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
  if (!ds.valid()) return H5Fail(path);
  if (n > 0 && H5Dwrite(ds.get(), mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    return H5Fail(path);
  return Status::Ok();
}

}  // namespace

Status WriteOpTables(hid_t file, hid_t lcpl, const OpCollector& ops) {
  if (ops.empty()) return Status::Ok();
  H5Handle g(H5Gcreate2(file, kOpsGroupPath, lcpl, H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) return H5Fail(kOpsGroupPath);
  std::vector<std::string> table;
  for (const OpDef* d : ops.ops()) table.push_back(OpTableEntryJson(*d));
  LOCKSTEP_RETURN_IF_ERROR(WriteStrings(file, lcpl, kOpsTablePath, table));
  std::vector<OpRecordRow> rows;
  std::vector<double> l2;
  rows.reserve(ops.records().size());
  l2.reserve(ops.records().size());
  for (const OpCollector::Record& r : ops.records()) {
    OpRecordRow row{};
    row.window = r.window, row.stage = r.stage, row.layer = r.layer, row.op = r.op;
    row.index = r.index, row.position = r.position, row.row = r.row;
    std::memcpy(&row.digest, &r.digest, sizeof(row.digest));
    row.dump_offset = r.dump_offset, row.dump_len = r.dump_len;
    rows.push_back(row);
    l2.push_back(r.l2);
  }
  H5Handle t = RowType(sizeof(OpRecordRow), kOpRecordFields);
  if (!t.valid()) return H5Fail("ops/records type");
  LOCKSTEP_RETURN_IF_ERROR(
      WriteRecords(file, lcpl, kOpsRecordsPath, t.get(), rows.data(), rows.size()).status());
  LOCKSTEP_RETURN_IF_ERROR(WriteNumbers(file, lcpl, kOpsL2Path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                                        l2.data(), l2.size()));
  if (!ops.dump().empty())
    LOCKSTEP_RETURN_IF_ERROR(WriteNumbers(file, lcpl, kOpsDumpPath, H5T_IEEE_F32LE,
                                          H5T_NATIVE_FLOAT, ops.dump().data(), ops.dump().size()));
  return Status::Ok();
}

}  // namespace lockstep
