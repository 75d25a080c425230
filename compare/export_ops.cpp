#include "export_ops.h"

#include <nlohmann/json.hpp>

#include "h5_bounded.h"
#include "lockstep/h5/paths.h"
#include "lockstep/h5/rows.h"

namespace lockstep {

namespace {

// A 1-D float dataset (f32 or f64 in the file) of at most `max_n` values, read as T.
template <class T>
Status ReadFloats(hid_t f, const std::string& path, const ReaderLimits& lim, std::int64_t max_n,
                  std::int64_t file_bytes, hid_t mem_t, std::vector<T>* out) {
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
  H5Handle ft(H5Dget_type(ds.get()));
  if (!ft.valid() || H5Tget_class(ft.get()) != H5T_FLOAT)
    return Bad(path, "holds " + (ft.valid() ? DescribeType(ft.get()) : std::string("?")) +
                         ", expected floats");
  LOCKSTEP_ASSIGN_OR_RETURN(auto shape, Shape(ds.get(), path, lim));
  if (shape.size() != 1) return Bad(path, "expected one dimension, got " + ShapeText(shape));
  if (shape[0] > max_n) return Bad(path, "holds more than the limit of " + std::to_string(max_n));
  if (BytesWithin(shape, static_cast<std::int64_t>(H5Tget_size(ft.get())), file_bytes) < 0)
    return Bad(path, "larger than the file itself (truncated or corrupt)");
  out->resize(static_cast<std::size_t>(shape[0]));
  if (!out->empty() && H5Dread(ds.get(), mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) < 0)
    return Bad(path, "unreadable (corrupt file?)");
  return Status::Ok();
}

}  // namespace

Status ReadOps(hid_t f, const ReaderLimits& lim, ExportMeta* meta) {
  if (H5Lexists(f, kOpsGroupPath, H5P_DEFAULT) <= 0) return Status::Ok();
  LOCKSTEP_RETURN_IF_ERROR(OpenObject(f, kOpsGroupPath, H5I_GROUP).status());
  const std::int64_t max_str = std::min(lim.max_string_bytes, meta->file_bytes);
  std::vector<std::string> table;
  LOCKSTEP_RETURN_IF_ERROR(ReadStringList(f, kOpsTablePath, max_str, &table));
  for (std::size_t i = 0; i < table.size(); ++i) {
    const std::string at = "/" + std::string(kOpsTablePath) + " row " + std::to_string(i);
    const nlohmann::json j = nlohmann::json::parse(table[i], nullptr, false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("inputs") ||
        !j["inputs"].is_array())
      return Bad(at, "expected {\"name\": ..., \"inputs\": [...], \"state\": ...}");
    ExportOpName n;
    n.name = j["name"].get<std::string>();
    for (const auto& in : j["inputs"]) {
      if (!in.is_string()) return Bad(at, "an input is not a string");
      n.inputs.push_back(in.get<std::string>());
    }
    n.state = j.value("state", false);
    meta->op_table.push_back(std::move(n));
  }
  const std::string path = "/" + std::string(kOpsRecordsPath);
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
  LOCKSTEP_ASSIGN_OR_RETURN(auto rows, ReadTable(ds.get(), path, kOpRecordFields, lim,
                                                 lim.max_windows, meta->file_bytes));
  std::vector<double> l2;
  LOCKSTEP_RETURN_IF_ERROR(
      ReadFloats(f, kOpsL2Path, lim, lim.max_windows, meta->file_bytes, H5T_NATIVE_DOUBLE, &l2));
  if (l2.size() != rows.size())
    return Bad(std::string("/") + kOpsL2Path, std::to_string(l2.size()) + " values for " +
                                                  std::to_string(rows.size()) +
                                                  " records (one per record)");
  if (H5Lexists(f, kOpsDumpPath, H5P_DEFAULT) > 0)
    LOCKSTEP_RETURN_IF_ERROR(ReadFloats(f, kOpsDumpPath, lim, lim.max_item_bytes / 4,
                                        meta->file_bytes, H5T_NATIVE_FLOAT, &meta->op_dump));
  const auto n_ops = static_cast<std::int64_t>(meta->op_table.size());
  const auto n_dump = static_cast<std::int64_t>(meta->op_dump.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const std::string at = path + " row " + std::to_string(i);
    for (std::size_t k = 0; k < 7; ++k)
      if (r[k] < INT32_MIN || r[k] > INT32_MAX)
        return Bad(at, std::string(kOpRecordFields[k].name) + " out of range");
    if (r[3] < 0 || r[3] >= n_ops)
      return Bad(at, "op " + std::to_string(r[3]) + " is not a row of /ops/table");
    if (r[8] < -1 || (r[8] >= 0 && (r[9] < 0 || r[8] > n_dump || r[9] > n_dump - r[8])))
      return Bad(at, "dump rows outside /ops/dump");
    ExportOpRecord o;
    o.window = static_cast<std::int32_t>(r[0]), o.stage = static_cast<std::int32_t>(r[1]);
    o.layer = static_cast<std::int32_t>(r[2]), o.op = static_cast<std::int32_t>(r[3]);
    o.index = static_cast<std::int32_t>(r[4]), o.position = static_cast<std::int32_t>(r[5]);
    o.row = static_cast<std::int32_t>(r[6]);
    o.digest = r[7], o.l2 = l2[i], o.dump_offset = r[8], o.dump_len = r[8] >= 0 ? r[9] : 0;
    meta->op_records.push_back(o);
  }
  return Status::Ok();
}

}  // namespace lockstep
