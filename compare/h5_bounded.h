// Bounded HDF5 readers for the export reader (private to compare/): every size read from a file is
// checked against ReaderLimits, or against the file's length, before anything is allocated, and
// every failure is a kInvalidArgument Status naming the in-file path ("<path>: <what is wrong>"),
// never an HDF5 error stack on stderr. Links are followed only when they are hard links. These
// are thin wrappers of the HDF5 C API: single-threaded like it (handle.h), no state of their own.
#pragma once

#include <hdf5.h>
#include <sys/types.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/compare/export_reader.h"
#include "lockstep/engine/status.h"
#include "lockstep/h5/handle.h"
#include "lockstep/h5/paths.h"  // ParseIndex
#include "lockstep/h5/rows.h"

namespace lockstep {

// kInvalidArgument "<path>: <detail>": what every check below returns.
Status Bad(const std::string& path, const std::string& detail);

// True when the first 8 bytes at offset 0 of `fd` are the HDF5 signature (the exporter writes no
// user block). *got: what pread() returned (< 0: read error, errno set).
bool HasHdf5Signature(int fd, ssize_t* got);

// "4-byte floats", "2-byte unsigned integers", ...: an HDF5 type for messages.
std::string DescribeType(hid_t t);
// "[3, 4]".
std::string ShapeText(const std::vector<std::int64_t>& shape);
// Bytes held by `shape` at `elem` bytes per element, or -1 when that exceeds `limit` (no overflow).
std::int64_t BytesWithin(const std::vector<std::int64_t>& shape, std::int64_t elem,
                         std::int64_t limit);

// ---- groups and objects ----

struct Link {
  std::string name;
  H5L_type_t type;
};
// The members of an open group (at most `max_links`, all hard links; else an error).
Result<std::vector<Link>> Children(hid_t group, const std::string& path, std::int64_t max_links);
// Opens the object at absolute `path`, checking that every component is a hard link and that the
// object is of kind `want` (H5I_GROUP or H5I_DATASET).
Result<H5Handle> OpenObject(hid_t file, const std::string& path, H5I_type_t want);
// Opens `name`, a hard link of the already-open group `parent` whose links Children() checked,
// without resolving and re-checking every prefix of the absolute `path` from the root again: with
// thousands of items per export that walk was most of the time to open a file.
Result<H5Handle> OpenChild(hid_t parent, const std::string& path, const std::string& name,
                           H5I_type_t want);

// ---- attributes and strings ----

// One scalar string of an attribute or a dataset, fixed- or variable-length, at most `max_bytes`.
Result<std::string> ReadString(hid_t id, bool is_attr, const std::string& what,
                               std::int64_t max_bytes);
// Attribute `name` of `obj` (error "missing attribute" when absent or unreadable).
Result<H5Handle> OpenAttr(hid_t obj, const std::string& path, const char* name);
// One integer attribute, read as int64.
Result<std::int64_t> IntAttr(hid_t obj, const std::string& path, const char* name);
// One integer attribute that must fit an int.
Result<int> SmallIntAttr(hid_t obj, const std::string& path, const char* name);
// One string attribute of at most `max_bytes`.
Result<std::string> StrAttr(hid_t obj, const std::string& path, const char* name,
                            std::int64_t max_bytes);

// A 1-D dataset `name` (relative to the root) of fixed-length strings, absent = no strings: at
// most 4096 records and `max_bytes` in all (/injections, /ops/table).
Status ReadStringList(hid_t f, const char* name, std::int64_t max_bytes,
                      std::vector<std::string>* out);

// ---- datasets ----

// Dimensions of a dataset, each checked against the limits (rank, every dimension).
Result<std::vector<std::int64_t>> Shape(hid_t ds, const std::string& path, const ReaderLimits& lim);

// The rows of a compound dataset (rank 1, or rank 2 read flattened) as int64 fields, read by
// field NAME: HDF5 matches the memory compound to the file's members by name, so their order and
// any extra members in the file do not matter. A missing or non-integer field is an error.
template <std::size_t N>
Result<std::vector<std::array<std::int64_t, N>>> ReadTable(hid_t ds, const std::string& path,
                                                           const std::array<RowField, N>& fields,
                                                           const ReaderLimits& lim,
                                                           std::int64_t max_rows,
                                                           std::int64_t file_bytes) {
  using Row = std::array<std::int64_t, N>;
  H5Handle ft(H5Dget_type(ds));
  if (!ft.valid() || H5Tget_class(ft.get()) != H5T_COMPOUND)
    return Bad(path, "holds " + (ft.valid() ? DescribeType(ft.get()) : std::string("?")) +
                         ", expected compound records");
  for (const RowField& field : fields) {
    const char* f = field.name;
    const int idx = H5Tget_member_index(ft.get(), f);
    if (idx < 0) return Bad(path, std::string("compound has no field '") + f + "'");
    if (H5Tget_member_class(ft.get(), static_cast<unsigned>(idx)) != H5T_INTEGER)
      return Bad(path, std::string("field '") + f + "' is not an integer");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto shape, Shape(ds, path, lim));
  if (shape.empty() || shape.size() > 2)
    return Bad(path, "expected a one-dimensional table, got shape " + ShapeText(shape));
  const std::int64_t n = shape.size() == 1 ? shape[0] : BytesWithin(shape, 1, max_rows);
  if (n < 0 || n > max_rows)
    return Bad(path, "holds more than the limit of " + std::to_string(max_rows) + " rows");
  if (BytesWithin({n}, static_cast<std::int64_t>(H5Tget_size(ft.get())), file_bytes) < 0)
    return Bad(path,
               std::to_string(n) + " rows are larger than the file itself (truncated or corrupt)");
  H5Handle mt(H5Tcreate(H5T_COMPOUND, sizeof(Row)));
  for (std::size_t i = 0; i < N; ++i)
    H5Tinsert(mt.get(), fields[i].name, i * sizeof(std::int64_t), H5T_NATIVE_INT64);
  std::vector<Row> rows(static_cast<std::size_t>(n));
  if (n > 0 && H5Dread(ds, mt.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) < 0)
    return Bad(path, "rows unreadable (corrupt file?)");
  return rows;
}

// One line per field (from `first` on) that is -1 in some rows: "trace/windows export_ns: unknown
// in 3 of 9 windows".
template <std::size_t N>
void UnknownLines(const std::vector<std::array<std::int64_t, N>>& rows,
                  const std::array<RowField, N>& fields, std::size_t first,
                  const std::string& table, const char* unit, std::vector<std::string>* out) {
  for (std::size_t f = first; f < N; ++f) {
    const auto n =
        std::count_if(rows.begin(), rows.end(), [&](const auto& r) { return r[f] == -1; });
    if (n > 0)
      out->push_back(table + " " + fields[f].name + ": unknown in " + std::to_string(n) + " of " +
                     std::to_string(rows.size()) + " " + unit);
  }
}

}  // namespace lockstep
