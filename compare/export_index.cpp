// The items of an export (see export_index.h): the dataset walk under /checkpoints, /index/items,
// and where each item's rows are.
#include "export_index.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

namespace lockstep {
namespace {

// The element types an export's items hold, by their `dtype` attribute (dtype_name spelling).
std::optional<DType> ParseItemDtype(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI8, DType::kU8})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

// The native type an item's elements are read as (bf16: its raw bits).
hid_t ItemMemType(DType t) {
  return t == DType::kBF16 ? H5T_NATIVE_UINT16
         : t == DType::kI8 ? H5T_NATIVE_INT8
         : t == DType::kU8 ? H5T_NATIVE_UINT8
                           : H5T_NATIVE_FLOAT;
}

// Items sort by (stage, layer with -1 last, kind in schema order).
bool ItemOrder(const ExportItem& a, const ExportItem& b) {
  const auto key = [](const ExportItem& x) {
    return std::make_tuple(x.stage, x.layer < 0 ? INT_MAX : x.layer, x.kind);
  };
  return key(a) < key(b);
}

}  // namespace

// Records how to read `ds`: pread() at its file offset when the raw bytes are exactly what the
// caller gets (contiguous, unfiltered, allocated, file type == native type), else H5Dread.
Status ExportReader::Impl::Locate(hid_t ds, const std::string& path, hid_t mem_type,
                                  const std::vector<std::int64_t>& shape, std::int64_t bytes,
                                  Loc* loc) {
  loc->path = path;
  loc->mem_type = mem_type;
  loc->dims.assign(shape.begin(), shape.end());
  loc->rows = shape.empty() ? 1 : shape[0];
  loc->row_bytes = loc->rows == 0 ? 0 : bytes / loc->rows;
  H5Handle dcpl(H5Dget_create_plist(ds)), ft(H5Dget_type(ds));
  if (!dcpl.valid() || !ft.valid())
    return Bad(path, "creation properties unreadable (corrupt file?)");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_VIRTUAL || H5Pget_external_count(dcpl.get()) != 0)
    return Bad(path, "stores its data in other files (virtual or external dataset)");
  if (bytes == 0) {  // nothing to read: only empty ranges are in bounds
    loc->offset = 0;
    return Status::Ok();
  }
  const haddr_t off = H5Dget_offset(ds);
  if (layout == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl.get()) == 0 &&
      H5Tequal(ft.get(), mem_type) > 0 && off != HADDR_UNDEF) {
    const auto file_bytes = static_cast<haddr_t>(meta.file_bytes);
    if (off > file_bytes || static_cast<haddr_t>(bytes) > file_bytes - off)
      return Bad(path, "raw data at offset " + std::to_string(off) + " + " + std::to_string(bytes) +
                           " bytes lies past the end of the file (" +
                           std::to_string(meta.file_bytes) + " bytes): truncated?");
    loc->offset = static_cast<std::int64_t>(off);
  } else {
    needs_fallback =
        true;  // chunked/compressed/other byte order, or never allocated (reads the fill value)
  }
  return Status::Ok();
}

Result<ExportItem> ExportReader::Impl::ReadItem(hid_t parent, const std::string& leaf,
                                                const std::string& cp_path, const std::string& rel,
                                                int stage, int layer, ItemKind kind, Loc* loc) {
  const std::string path = cp_path + "/" + rel;
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenChild(parent, path, leaf, H5I_DATASET));
  if (++n_items > limits.max_items)
    return Bad("/checkpoints",
               "more than the limit of " + std::to_string(limits.max_items) + " items");
  ExportItem it;
  it.rel = rel;
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string kind_attr, StrAttr(ds.get(), path, "kind", 64));
  LOCKSTEP_ASSIGN_OR_RETURN(it.stage, SmallIntAttr(ds.get(), path, "stage"));
  LOCKSTEP_ASSIGN_OR_RETURN(it.layer, SmallIntAttr(ds.get(), path, "layer"));
  LOCKSTEP_ASSIGN_OR_RETURN(it.valid_rows, IntAttr(ds.get(), path, "valid_rows"));
  LOCKSTEP_ASSIGN_OR_RETURN(it.capacity_rows, IntAttr(ds.get(), path, "capacity_rows"));
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string dtype_attr, StrAttr(ds.get(), path, "dtype", 64));
  if (ParseItemKind(kind_attr) != kind)
    return Bad(path,
               "kind attribute '" + kind_attr + "' but the path says '" + ItemKindName(kind) + "'");
  it.kind = kind;
  if (it.stage != stage || it.layer != layer)
    return Bad(path, "stage/layer attributes " + std::to_string(it.stage) + "/" +
                         std::to_string(it.layer) + " but the path says " + std::to_string(stage) +
                         "/" + std::to_string(layer));
  H5Handle ft(H5Dget_type(ds.get()));
  if (!ft.valid()) return Bad(path, "datatype unreadable (corrupt file?)");
  const H5T_class_t cls = H5Tget_class(ft.get());
  const std::size_t size = H5Tget_size(ft.get());
  const bool is_int = cls == H5T_INTEGER;
  const std::optional<DType> dtype = ParseItemDtype(dtype_attr);
  if (!dtype)
    return Bad(path,
               "unknown dtype attribute '" + dtype_attr + "' (expected f32, bf16, int8 or u8)");
  it.dtype = *dtype;
  const hid_t mem_type = ItemMemType(it.dtype);
  const bool type_ok =
      it.dtype == DType::kF32    ? cls == H5T_FLOAT && size == 4
      : it.dtype == DType::kBF16 ? is_int && size == 2 && H5Tget_sign(ft.get()) == H5T_SGN_NONE
      : it.dtype == DType::kU8   ? is_int && size == 1 && H5Tget_sign(ft.get()) == H5T_SGN_NONE
                                 : is_int && size == 1 && H5Tget_sign(ft.get()) == H5T_SGN_2;
  if (!type_ok)
    return Bad(path, "dtype attribute '" + dtype_attr + "' but the dataset holds " +
                         DescribeType(ft.get()));
  LOCKSTEP_ASSIGN_OR_RETURN(it.shape, Shape(ds.get(), path, limits));
  if (it.shape.empty()) return Bad(path, "is a scalar; items are rows first (rank >= 1)");
  if (it.valid_rows != it.shape[0])
    return Bad(path, "valid_rows attribute " + std::to_string(it.valid_rows) +
                         " but the dataset has " + std::to_string(it.shape[0]) + " rows");
  if (it.capacity_rows < it.valid_rows)
    return Bad(path, "capacity_rows " + std::to_string(it.capacity_rows) + " < valid_rows " +
                         std::to_string(it.valid_rows));
  LOCKSTEP_ASSIGN_OR_RETURN(const std::int64_t bytes, ItemBytes(path, it));
  LOCKSTEP_RETURN_IF_ERROR(Locate(ds.get(), path, mem_type, it.shape, bytes, loc));
  return it;
}

// `<item>_scale`: f32 [rows, heads] of an int8 item of shape [rows, heads, ...].
Status ExportReader::Impl::ReadScale(hid_t parent, const std::string& leaf, const std::string& path,
                                     ExportItem* item, Loc* loc) {
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenChild(parent, path, leaf, H5I_DATASET));
  if (item->dtype != DType::kI8)
    return Bad(path, "scales of an item whose dtype is '" + std::string(dtype_name(item->dtype)) +
                         "', not int8");
  H5Handle ft(H5Dget_type(ds.get()));
  if (!ft.valid() || H5Tget_class(ft.get()) != H5T_FLOAT || H5Tget_size(ft.get()) != 4)
    return Bad(path, "scales must be 4-byte floats, the dataset holds " +
                         (ft.valid() ? DescribeType(ft.get()) : "?"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto shape, Shape(ds.get(), path, limits));
  if (shape.size() != 2 || item->shape.size() < 2 || shape[0] != item->shape[0] ||
      shape[1] != item->shape[1])
    return Bad(path, "scale shape " + ShapeText(shape) + " does not fit item shape " +
                         ShapeText(item->shape) + " (expected [rows, heads])");
  const std::int64_t bytes =
      BytesWithin(shape, 4, std::min(limits.max_item_bytes, meta.file_bytes));
  if (bytes < 0) return Bad(path, "scale shape " + ShapeText(shape) + " is larger than the file");
  LOCKSTEP_RETURN_IF_ERROR(Locate(ds.get(), path, H5T_NATIVE_FLOAT, shape, bytes, loc));
  item->has_scales = true;
  item->scale_row_elems = shape[1];
  return Status::Ok();
}

Status ExportReader::Impl::ReadCheckpointAttrs(hid_t group, const std::string& name,
                                               ExportCheckpoint* out) {
  const std::string path = "/checkpoints/" + name;
  ExportCheckpoint& cp = *out;
  cp.name = name;
  LOCKSTEP_ASSIGN_OR_RETURN(cp.window, SmallIntAttr(group, path, "window"));
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string point, StrAttr(group, path, "point", 64));
  LOCKSTEP_ASSIGN_OR_RETURN(cp.p, IntAttr(group, path, "p"));
  LOCKSTEP_ASSIGN_OR_RETURN(cp.T, IntAttr(group, path, "T"));
  LOCKSTEP_ASSIGN_OR_RETURN(cp.committed_rows, IntAttr(group, path, "committed_rows"));
  LOCKSTEP_ASSIGN_OR_RETURN(cp.spec_rows, IntAttr(group, path, "spec_rows"));
  LOCKSTEP_ASSIGN_OR_RETURN(cp.recurrent_pos, IntAttr(group, path, "recurrent_pos"));
  const std::optional<CheckpointPoint> parsed = ParseCheckpointPoint(point);
  if (!parsed || cp.window < 0 || name != CheckpointName(cp.window, *parsed))
    return Bad(
        path,
        "attributes window " + std::to_string(cp.window) + ", point '" + point +
            "' do not match the group name (expected {W:05d}_{pre_verify|post_verify|commit})");
  cp.point = *parsed;
  return Status::Ok();
}

Status ExportReader::Impl::ReadCheckpoint(const std::string& name) {
  const std::string path = "/checkpoints/" + name;
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle g, OpenObject(file.get(), path, H5I_GROUP));
  ExportCheckpoint cp;
  LOCKSTEP_RETURN_IF_ERROR(ReadCheckpointAttrs(g.get(), name, &cp));
  LOCKSTEP_ASSIGN_OR_RETURN(auto stages, Children(g.get(), path, limits.max_items));
  for (const Link& st : stages) {
    const int s = ParseIndex(st.name, "stage");
    const std::string sp = path + "/" + st.name;
    if (s < 0) return Bad(sp, "unexpected entry (lockstep.export v1 has only stage{S} here)");
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle sg, OpenChild(g.get(), sp, st.name, H5I_GROUP));
    LOCKSTEP_ASSIGN_OR_RETURN(auto entries, Children(sg.get(), sp, limits.max_items));
    for (const Link& e : entries) {
      const std::string rel_dir = st.name + "/" + e.name;
      const std::optional<ItemKind> stage_item = ParseItemKind(e.name);
      if (stage_item == ItemKind::kHiddenOut || stage_item == ItemKind::kLogits) {
        Loc loc;
        LOCKSTEP_ASSIGN_OR_RETURN(
            ExportItem it, ReadItem(sg.get(), e.name, path, rel_dir, s, -1, *stage_item, &loc));
        locs[name + "/" + rel_dir].data = std::move(loc);
        cp.items.push_back(std::move(it));
        continue;
      }
      const int layer = ParseIndex(e.name, "layer");
      if (layer < 0 && e.name != "mtp")
        return Bad(sp + "/" + e.name,
                   "unexpected entry (expected layer{L}, mtp, hidden_out or logits)");
      LOCKSTEP_ASSIGN_OR_RETURN(H5Handle lg,
                                OpenChild(sg.get(), sp + "/" + e.name, e.name, H5I_GROUP));
      LOCKSTEP_ASSIGN_OR_RETURN(auto names,
                                Children(lg.get(), sp + "/" + e.name, limits.max_items));
      const std::size_t first = cp.items.size();
      std::vector<std::string> scales;
      for (const Link& n : names) {
        const std::string item_path = sp + "/" + e.name + "/" + n.name;
        if (n.name.size() > 6 && n.name.compare(n.name.size() - 6, 6, "_scale") == 0) {
          scales.push_back(n.name);
          continue;
        }
        const std::optional<ItemKind> kind = ParseItemKind(layer >= 0 ? n.name : "mtp_" + n.name);
        if (!kind || (layer >= 0 ? !IsLayerItem(*kind)
                                 : *kind != ItemKind::kMtpK && *kind != ItemKind::kMtpV))
          return Bad(item_path, "unexpected entry (not an item of lockstep.export v1)");
        Loc loc;
        LOCKSTEP_ASSIGN_OR_RETURN(
            ExportItem it,
            ReadItem(lg.get(), n.name, path, rel_dir + "/" + n.name, s, layer, *kind, &loc));
        locs[name + "/" + it.rel].data = std::move(loc);
        cp.items.push_back(std::move(it));
      }
      // `*_scale` datasets belong to the item of the same name in this group.
      for (const std::string& sc : scales) {
        const std::string base_rel = rel_dir + "/" + sc.substr(0, sc.size() - 6);
        auto owner =
            std::find_if(cp.items.begin() + static_cast<std::ptrdiff_t>(first), cp.items.end(),
                         [&](const ExportItem& it) { return it.rel == base_rel; });
        const std::string scale_path = sp + "/" + e.name + "/" + sc;
        if (owner == cp.items.end() || owner->kind == ItemKind::kConvState ||
            owner->kind == ItemKind::kSsmState)
          return Bad(scale_path, "scales without a K/V item of the same name");
        LOCKSTEP_RETURN_IF_ERROR(
            ReadScale(lg.get(), sc, scale_path, &*owner, &locs[name + "/" + base_rel].scale));
      }
    }
  }
  std::sort(cp.items.begin(), cp.items.end(), ItemOrder);
  meta.checkpoints.push_back(std::move(cp));
  return Status::Ok();
}

// Exports written by lockstep carry /index/items: every item's kind, dtype, shape and file offset
// in one table. Reading it replaces opening every dataset (HDF5's per-object work was ~80% of a
// diff of an export with thousands of small items). Every row is checked like a dataset would be:
// path grammar, kind/stage/layer against the path, dtype, shape within the limits, offset + size
// within the file. The first item of every checkpoint is also opened the slow way and must agree
// with its row, so a stale or foreign index is an error, not silently wrong bytes.
Status ExportReader::Impl::ReadIndexed(hid_t cps, const std::vector<Link>& names) {
  const std::string ipath = "/index/items";
  LOCKSTEP_ASSIGN_OR_RETURN(auto cp_at, ReadCheckpointGroups(cps, names));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<IndexRow> rows, ReadIndexRows());
  std::set<std::string> checked;  // checkpoints whose first item was cross-checked
  for (std::size_t i = 0; i < rows.size(); ++i) {
    IndexRow& r = rows[i];
    r.checkpoint[sizeof(r.checkpoint) - 1] = r.rel[sizeof(r.rel) - 1] = 0;
    const std::string where = ipath + " row " + std::to_string(i);
    const std::string cp_name = r.checkpoint, rel = r.rel;
    auto cpi = cp_at.find(cp_name);
    if (cpi == cp_at.end())
      return Bad(where, "names checkpoint '" + cp_name + "', which /checkpoints does not hold");
    const std::string path = "/checkpoints/" + cp_name + "/" + rel;
    ItemLoc il;
    std::int64_t bytes = 0;
    LOCKSTEP_ASSIGN_OR_RETURN(ExportItem it, IndexedItem(r, where, path, &il, &bytes));
    if (!locs.emplace(cp_name + "/" + rel, il).second)
      return Bad(path, "listed twice in the index");
    if (++n_items > limits.max_items)
      return Bad(ipath, "more than the limit of " + std::to_string(limits.max_items) + " items");
    if (checked.insert(cp_name).second)
      LOCKSTEP_RETURN_IF_ERROR(CrossCheck(cp_name, path, it, il, bytes));
    meta.checkpoints[cpi->second].items.push_back(std::move(it));
  }
  for (auto& cp : meta.checkpoints) std::sort(cp.items.begin(), cp.items.end(), ItemOrder);
  return Status::Ok();
}

Result<std::map<std::string, std::size_t>> ExportReader::Impl::ReadCheckpointGroups(
    hid_t cps, const std::vector<Link>& names) {
  std::map<std::string, std::size_t> cp_at;
  for (const Link& l : names) {
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle g,
                              OpenChild(cps, "/checkpoints/" + l.name, l.name, H5I_GROUP));
    ExportCheckpoint cp;
    LOCKSTEP_RETURN_IF_ERROR(ReadCheckpointAttrs(g.get(), l.name, &cp));
    cp_at[l.name] = meta.checkpoints.size();
    meta.checkpoints.push_back(std::move(cp));
  }
  return cp_at;
}

Result<std::vector<IndexRow>> ExportReader::Impl::ReadIndexRows() {
  const std::string ipath = "/index/items";
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(file.get(), ipath, H5I_DATASET));
  H5Handle ft(H5Dget_type(ds.get()));
  if (!ft.valid() || H5Tget_class(ft.get()) != H5T_COMPOUND)
    return Bad(ipath, "expected compound records");
  // Rows are read in the exporter's own layout (rows.h), so reading lockstep's exports needs no
  // type conversion (HDF5's conversion path allocates and clears buffers per read); the file's
  // fields are matched to it by name.
  H5Handle mt = IndexRowType();
  if (!mt.valid()) return Bad(ipath, "HDF5 failed building the row type");
  for (unsigned m = 0; m < static_cast<unsigned>(H5Tget_nmembers(mt.get())); ++m) {
    char* name = H5Tget_member_name(mt.get(), m);
    const std::string f = name != nullptr ? name : "";
    H5free_memory(name);
    const H5T_class_t want = H5Tget_member_class(mt.get(), m);
    const int idx = H5Tget_member_index(ft.get(), f.c_str());
    if (idx < 0 || H5Tget_member_class(ft.get(), static_cast<unsigned>(idx)) != want)
      return Bad(ipath, "field '" + f + "' missing or not " +
                            (want == H5T_STRING    ? "a string"
                             : want == H5T_INTEGER ? "an integer"
                                                   : "an array"));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto shape, Shape(ds.get(), ipath, limits));
  if (shape.size() != 1)
    return Bad(ipath, "expected a one-dimensional table, got shape " + ShapeText(shape));
  const std::int64_t n = shape[0];
  if (n > limits.max_items)
    return Bad(ipath, "more than the limit of " + std::to_string(limits.max_items) + " items");
  if (BytesWithin({n}, static_cast<std::int64_t>(H5Tget_size(ft.get())), meta.file_bytes) < 0)
    return Bad(ipath,
               std::to_string(n) + " rows are larger than the file itself (truncated or corrupt)");
  std::vector<IndexRow> rows(static_cast<std::size_t>(n));
  if (n > 0 && H5Dread(ds.get(), mt.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) < 0)
    return Bad(ipath, "rows unreadable (corrupt file?)");
  return rows;
}

Result<ExportItem> ExportReader::Impl::IndexedItem(IndexRow& r, const std::string& where,
                                                   const std::string& path, ItemLoc* il,
                                                   std::int64_t* bytes_out) {
  r.kind[sizeof(r.kind) - 1] = r.dtype[sizeof(r.dtype) - 1] = 0;
  const std::string rel = r.rel;
  const std::optional<ItemAddress> addr = ParseItemRel(rel);
  if (!addr) return Bad(where, "'" + rel + "' is not an item path of lockstep.export v1");
  const int stage = addr->stage, layer = addr->layer;
  const ItemKind kind = addr->kind;
  if (ParseItemKind(r.kind) != kind || stage != r.stage || layer != r.layer)
    return Bad(path, "index row says kind " + std::string(r.kind) + " stage " +
                         std::to_string(r.stage) + " layer " + std::to_string(r.layer) +
                         ", the path says " + ItemKindName(kind) + " " + std::to_string(stage) +
                         " " + std::to_string(layer));
  ExportItem it;
  it.rel = rel;
  it.kind = kind;
  it.stage = stage;
  it.layer = layer;
  const std::optional<DType> dtype = ParseItemDtype(r.dtype);
  if (!dtype) return Bad(path, "unknown dtype '" + std::string(r.dtype) + "' in the index");
  it.dtype = *dtype;
  if (r.rank > limits.max_rank)
    return Bad(path, "rank " + std::to_string(r.rank) + " exceeds the limit of " +
                         std::to_string(limits.max_rank));
  if (r.rank < 1 || r.rank > 4)
    return Bad(path, "rank " + std::to_string(r.rank) + " in the index");
  for (std::int64_t d = 0; d < r.rank; ++d) {
    if (r.dims[d] < 0 || r.dims[d] > limits.max_dim)
      return Bad(path, "absurd dimension in the index");
    it.shape.push_back(r.dims[d]);
  }
  it.valid_rows = r.valid_rows;
  it.capacity_rows = r.capacity_rows;
  if (it.valid_rows != it.shape[0] || it.capacity_rows < it.valid_rows)
    return Bad(path, "valid_rows/capacity_rows disagree with the shape in the index");
  LOCKSTEP_ASSIGN_OR_RETURN(const std::int64_t bytes, ItemBytes(path, it));
  *bytes_out = bytes;
  // Offset -1: the data is not one contiguous run (chunked, e.g. --export-compress lz4): it is
  // read through HDF5 (H5Dread, which checks the selection against the real dataspace).
  auto in_file = [&](std::int64_t off, std::int64_t len) {
    return len == 0 || off == -1 ||
           (off >= 0 && off <= meta.file_bytes && len <= meta.file_bytes - off);
  };
  if (!in_file(r.offset, bytes))
    return Bad(path, "index offset " + std::to_string(r.offset) + " lies outside the file");
  il->data.path = path;
  il->data.mem_type = ItemMemType(it.dtype);
  il->data.dims.assign(it.shape.begin(), it.shape.end());
  il->data.rows = it.shape[0];
  il->data.row_bytes = il->data.rows == 0 ? 0 : bytes / il->data.rows;
  il->data.offset = bytes == 0 ? 0 : r.offset;
  needs_fallback = needs_fallback || il->data.offset < 0;
  if (r.scale_offset >= 0 || it.dtype == DType::kI8) {
    if (it.dtype != DType::kI8 || it.shape.size() < 2 || r.scale_dims[0] != it.shape[0] ||
        r.scale_dims[1] != it.shape[1])
      return Bad(path,
                 "index scales do not fit the item (expected int8 with scales [rows, heads])");
    const std::int64_t sbytes = BytesWithin({r.scale_dims[0], r.scale_dims[1]}, 4, meta.file_bytes);
    if (sbytes < 0 || !in_file(r.scale_offset, sbytes))
      return Bad(path, "index scale offset lies outside the file");
    it.has_scales = true;
    it.scale_row_elems = r.scale_dims[1];
    il->scale.path = path + "_scale";
    il->scale.mem_type = H5T_NATIVE_FLOAT;
    il->scale.dims = {static_cast<hsize_t>(r.scale_dims[0]), static_cast<hsize_t>(r.scale_dims[1])};
    il->scale.rows = r.scale_dims[0];
    il->scale.row_bytes = r.scale_dims[1] * 4;
    il->scale.offset = sbytes == 0 ? 0 : r.scale_offset;
    needs_fallback = needs_fallback || il->scale.offset < 0;
  }
  return it;
}

// Cross-checks an indexed item against the dataset itself (the full validation of the slow path).
Status ExportReader::Impl::CrossCheck(const std::string& cp_name, const std::string& path,
                                      const ExportItem& it, const ItemLoc& il, std::int64_t bytes) {
  const auto slash = path.find_last_of('/');
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle parent,
                            OpenObject(file.get(), path.substr(0, slash), H5I_GROUP));
  Loc loc;
  LOCKSTEP_ASSIGN_OR_RETURN(
      ExportItem full, ReadItem(parent.get(), path.substr(slash + 1), "/checkpoints/" + cp_name,
                                it.rel, it.stage, it.layer, it.kind, &loc));
  if (full.shape != it.shape || full.dtype != it.dtype || full.capacity_rows != it.capacity_rows ||
      (bytes > 0 && loc.offset >= 0 && loc.offset != il.data.offset))
    return Bad("/index/items", "disagrees with dataset " + path +
                                   " (a stale or foreign index): open with the index off");
  return Status::Ok();
}

}  // namespace lockstep
