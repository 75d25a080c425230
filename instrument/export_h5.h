// The export writer's HDF5 helpers that the op tables' writer (op_export_write.cpp) shares with
// export_writer.cpp. Writer thread only (single-threaded HDF5).
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "lockstep/engine/status.h"
#include "lockstep/h5/handle.h"
#include "lockstep/instrument/op_export.h"

namespace lockstep {

// kIOError "HDF5 failed writing '<what>'" with the system error, if any.
Status H5Fail(const std::string& what);
// A one-dimensional dataset of n records of type t from `rows`, open for its attributes.
Result<H5Handle> WriteRecords(hid_t file, hid_t lcpl, const char* path, hid_t t, const void* rows,
                              std::size_t n);
// A 1-D dataset of fixed-length (null-padded) strings.
Status WriteStrings(hid_t file, hid_t lcpl, const char* path,
                    const std::vector<std::string>& records);
// /ops/table, /ops/records, /ops/l2 and /ops/dump (op_export.h); nothing when `ops` is empty.
Status WriteOpTables(hid_t file, hid_t lcpl, const OpCollector& ops);

}  // namespace lockstep
