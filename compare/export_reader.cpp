#include "lockstep/compare/export_reader.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "lockstep/h5/handle.h"
#include "lockstep/h5/rows.h"

namespace lockstep {
namespace {

Status Bad(const std::string& path, const std::string& detail) {
  return Status::InvalidArgument(path, detail);
}

// The HDF5 format signature; the exporter writes no user block, so it sits at offset 0.
bool HasHdf5Signature(int fd, ssize_t* got) {
  static constexpr unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  unsigned char sig[8] = {};
  *got = ::pread(fd, sig, sizeof(sig), 0);
  return *got == 8 && std::memcmp(sig, kSig, 8) == 0;
}

// The element types an export's items hold, by their `dtype` attribute (dtype_name spelling).
std::optional<DType> ParseItemDtype(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI8})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

// The native type an item's elements are read as (bf16: its raw bits).
hid_t ItemMemType(DType t) {
  return t == DType::kBF16 ? H5T_NATIVE_UINT16 : t == DType::kI8 ? H5T_NATIVE_INT8 : H5T_NATIVE_FLOAT;
}

// Items sort by (stage, layer with -1 last, kind in schema order).
bool ItemOrder(const ExportItem& a, const ExportItem& b) {
  const auto key = [](const ExportItem& x) {
    return std::make_tuple(x.stage, x.layer < 0 ? INT_MAX : x.layer, x.kind);
  };
  return key(a) < key(b);
}

// "stage12" -> 12 (digits only, no sign, fits an int); -1 otherwise.
int ParseIndex(const std::string& name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 9 ||
      name.compare(0, prefix.size(), prefix) != 0)
    return -1;
  int v = -1;
  const char* b = name.data() + prefix.size();
  const char* e = name.data() + name.size();
  auto [p, ec] = std::from_chars(b, e, v);
  return ec == std::errc() && p == e && *b != '+' && *b != '-' ? v : -1;
}

std::string DescribeType(hid_t t) {
  const std::string size = std::to_string(H5Tget_size(t)) + "-byte ";
  switch (H5Tget_class(t)) {
    case H5T_INTEGER:
      return size + (H5Tget_sign(t) == H5T_SGN_NONE ? "unsigned" : "signed") + " integers";
    case H5T_FLOAT:
      return size + "floats";
    case H5T_STRING:
      return "strings";
    case H5T_COMPOUND:
      return "compound records";
    default:
      return "values of HDF5 type class " + std::to_string(static_cast<int>(H5Tget_class(t)));
  }
}

std::string ShapeText(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bytes held by `shape` at `elem` bytes per element, or -1 when that exceeds `limit` (no overflow).
std::int64_t BytesWithin(const std::vector<std::int64_t>& shape, std::int64_t elem,
                         std::int64_t limit) {
  for (auto d : shape)
    if (d == 0) return 0;
  std::int64_t bytes = elem;
  for (auto d : shape) {
    if (bytes > limit / d) return -1;
    bytes *= d;
  }
  return bytes > limit ? -1 : bytes;
}

// Names and link types of a group's members, at most `max_links` of them.
struct Link {
  std::string name;
  H5L_type_t type;
};
herr_t CollectLink(hid_t, const char* name, const H5L_info_t* info, void* data) {
  static_cast<std::vector<Link>*>(data)->push_back({name, info->type});
  return 0;
}
Result<std::vector<Link>> Children(hid_t group, const std::string& path, std::int64_t max_links) {
  H5G_info_t gi;
  if (H5Gget_info(group, &gi) < 0)
    return Bad(path, "the group's link table is unreadable (corrupt file?)");
  if (gi.nlinks > static_cast<hsize_t>(max_links))
    return Bad(path, "holds " + std::to_string(gi.nlinks) + " entries, more than the limit of " +
                         std::to_string(max_links));
  std::vector<Link> links;
  links.reserve(static_cast<std::size_t>(gi.nlinks));
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr, CollectLink, &links) < 0 ||
      links.size() != gi.nlinks)
    return Bad(path, "the group's link table is unreadable (corrupt file?)");
  for (const Link& l : links)
    if (l.type !=
        H5L_TYPE_HARD)  // a soft or external link could point anywhere, even into another file
      return Bad(path + "/" + l.name,
                 "is a soft or external link (lockstep.export holds hard links only)");
  return links;
}

// Opens the object at absolute `path`, checking that every component is a hard link and that the
// object is of kind `want` (H5I_GROUP or H5I_DATASET).
Result<H5Handle> OpenObject(hid_t file, const std::string& path, H5I_type_t want) {
  for (std::size_t slash = path.find('/', 1); path != "/"; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    H5L_info_t li;
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0 ||
        H5Lget_info(file, prefix.c_str(), &li, H5P_DEFAULT) < 0)
      return Bad(prefix, "missing (required by lockstep.export v1)");
    if (li.type != H5L_TYPE_HARD)
      return Bad(prefix, "is a soft or external link (lockstep.export holds hard links only)");
    if (slash == std::string::npos) break;
  }
  H5Handle obj(H5Oopen(file, path.c_str(), H5P_DEFAULT));
  if (!obj.valid()) return Bad(path, "cannot be opened (corrupt object header?)");
  if (H5Iget_type(obj.get()) != want)
    return Bad(path, want == H5I_GROUP ? "is not a group" : "is not a dataset");
  return obj;
}

// Opens `name`, a hard link of the already-open group `parent` whose links Children() checked,
// without resolving and re-checking every prefix of the absolute `path` from the root again: with
// thousands of items per export that walk was most of the time to open a file.
Result<H5Handle> OpenChild(hid_t parent, const std::string& path, const std::string& name,
                      H5I_type_t want) {
  // H5Dopen2 / H5Gopen2 rather than H5Oopen: the generic open first works out the object's class
  // by probing its header, a second header pass per item.
  H5Handle obj(want == H5I_DATASET ? H5Dopen2(parent, name.c_str(), H5P_DEFAULT)
                              : H5Gopen2(parent, name.c_str(), H5P_DEFAULT));
  if (!obj.valid()) return Bad(path, "cannot be opened (corrupt object header?)");
  if (H5Iget_type(obj.get()) != want)
    return Bad(path, want == H5I_GROUP ? "is not a group" : "is not a dataset");
  return obj;
}

// One scalar string of an attribute or a dataset, fixed- or variable-length, at most `max_bytes`.
Result<std::string> ReadString(hid_t id, bool is_attr, const std::string& what,
                               std::int64_t max_bytes) {
  H5Handle ft(is_attr ? H5Aget_type(id) : H5Dget_type(id));
  H5Handle sp(is_attr ? H5Aget_space(id) : H5Dget_space(id));
  if (!ft.valid() || H5Tget_class(ft.get()) != H5T_STRING) return Bad(what, "is not a string");
  if (!sp.valid() || H5Sget_simple_extent_npoints(sp.get()) != 1)
    return Bad(what, "expected exactly one string");
  H5Handle mt(H5Tcopy(H5T_C_S1));
  H5Tset_cset(mt.get(), H5Tget_cset(ft.get()));  // HDF5 refuses ASCII <-> UTF-8 conversion
  const htri_t vlen = H5Tis_variable_str(ft.get());
  if (vlen < 0) return Bad(what, "string type unreadable");
  if (vlen > 0) {  // not what the exporter writes (fixed-length), but what other tools often write
    H5Tset_size(mt.get(), H5T_VARIABLE);
    char* p = nullptr;
    const herr_t r = is_attr ? H5Aread(id, mt.get(), &p)
                             : H5Dread(id, mt.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p);
    if (r < 0 || p == nullptr) return Bad(what, "string unreadable (corrupt file?)");
    const std::size_t len = strnlen(p, static_cast<std::size_t>(max_bytes) + 1);
    std::string s(p, len);
    H5free_memory(p);
    if (static_cast<std::int64_t>(len) > max_bytes)
      return Bad(what, "string longer than the limit of " + std::to_string(max_bytes) + " bytes");
    return s;
  }
  const std::size_t size = H5Tget_size(ft.get());
  if (size == 0 || static_cast<std::int64_t>(size) > max_bytes)
    return Bad(what, "string of " + std::to_string(size) + " bytes exceeds the limit of " +
                         std::to_string(max_bytes));
  H5Tset_size(mt.get(), size);
  H5Tset_strpad(mt.get(), H5T_STR_NULLPAD);
  std::string s(size, '\0');
  const herr_t r = is_attr ? H5Aread(id, mt.get(), s.data())
                           : H5Dread(id, mt.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data());
  if (r < 0) return Bad(what, "string unreadable (corrupt file?)");
  s.resize(strnlen(s.data(), size));
  return s;
}

Result<H5Handle> OpenAttr(hid_t obj, const std::string& path, const char* name) {
  // One lookup (H5Aopen fails cleanly on a missing name; error printing is off) instead of
  // H5Aexists + H5Aopen: attributes are most of the metadata an export holds.
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT));
  if (!a.valid()) return Bad(path, std::string("missing attribute '") + name + "' (or unreadable)");
  return a;
}

Result<std::int64_t> IntAttr(hid_t obj, const std::string& path, const char* name) {
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle a, OpenAttr(obj, path, name));
  H5Handle t(H5Aget_type(a.get())), sp(H5Aget_space(a.get()));
  if (H5Tget_class(t.get()) != H5T_INTEGER)
    return Bad(path, std::string("attribute '") + name + "' is not an integer");
  if (H5Sget_simple_extent_npoints(sp.get()) != 1)
    return Bad(path, std::string("attribute '") + name + "' is not one value");
  std::int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0)
    return Bad(path, std::string("attribute '") + name + "' unreadable");
  return v;
}

Result<int> SmallIntAttr(hid_t obj, const std::string& path, const char* name) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t v, IntAttr(obj, path, name));
  if (v < INT_MIN || v > INT_MAX)
    return Bad(path, std::string("attribute '") + name + "' out of range: " + std::to_string(v));
  return static_cast<int>(v);
}

Result<std::string> StrAttr(hid_t obj, const std::string& path, const char* name,
                            std::int64_t max_bytes) {
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle a, OpenAttr(obj, path, name));
  return ReadString(a.get(), true, path + " attribute '" + name + "'", max_bytes);
}

// Dimensions of a dataset, each checked against the limits.
Result<std::vector<std::int64_t>> Shape(hid_t ds, const std::string& path,
                                        const ReaderLimits& lim) {
  H5Handle sp(H5Dget_space(ds));
  if (!sp.valid()) return Bad(path, "dataspace unreadable (corrupt file?)");
  if (H5Sget_simple_extent_type(sp.get()) == H5S_NULL) return Bad(path, "has a null dataspace");
  const int rank = H5Sget_simple_extent_ndims(sp.get());
  if (rank < 0 || rank > lim.max_rank || rank > H5S_MAX_RANK)
    return Bad(path, "rank " + std::to_string(rank) + " exceeds the limit of " +
                         std::to_string(lim.max_rank));
  std::array<hsize_t, H5S_MAX_RANK> dims{};
  if (H5Sget_simple_extent_dims(sp.get(), dims.data(), nullptr) != rank)
    return Bad(path, "dataspace unreadable");
  std::vector<std::int64_t> shape;
  for (int i = 0; i < rank; ++i) {
    const hsize_t d = dims[static_cast<std::size_t>(i)];
    if (d > static_cast<hsize_t>(lim.max_dim))
      return Bad(path, "dimension " + std::to_string(i) + " is " + std::to_string(d) +
                           ", more than the limit of " + std::to_string(lim.max_dim));
    shape.push_back(static_cast<std::int64_t>(d));
  }
  return shape;
}

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

// /trace/windows fields before this one are path fields (ints and bools), the rest timings.
constexpr std::size_t kFirstWindowTiming = RowFieldIndex(kTraceWindowFields, "begin_ns");
// /trace/stages is optional: exports written before it have none; the windows then have no stages.
// Stages per window the reader accepts (the engine has four; the limit only bounds the table).
constexpr std::int64_t kMaxStagesPerWindow = 64;
constexpr std::array<const char*, 8> kCounterAttrs = {
    "expert_hits",  "expert_misses", "expert_bytes_fetched", "host_expert_tokens",
    "verify_calls", "first_calls",   "graph_captures",       "first_call_ns"};

// Minimum / maximum over the known (!= -1) values of column `f`; -1 when none is known.
template <std::size_t N>
std::int64_t Extreme(const std::vector<std::array<std::int64_t, N>>& rows, std::size_t f,
                     bool want_max) {
  std::int64_t best = -1;
  for (const auto& r : rows)
    if (r[f] != -1 && (best == -1 || (want_max ? r[f] > best : r[f] < best))) best = r[f];
  return best;
}

std::int32_t Clamp32(std::int64_t v) {
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(v, INT32_MIN, INT32_MAX));
}

herr_t CollectAttrName(hid_t, const char* name, const H5A_info_t*, void* data) {
  auto* names = static_cast<std::vector<std::string>*>(data);
  names->push_back(name);
  return names->size() > 4096 ? 1 : 0;  // stop: no legitimate counters group has that many
}

// Where one dataset's rows are and how to read them.
struct Loc {
  std::string path;  // in-file path (error messages, H5Dread fallback)
  std::vector<hsize_t> dims;
  std::int64_t rows = 0, row_bytes = 0;
  std::int64_t offset = -1;          // file offset of the raw contiguous data; -1: H5Dread fallback
  hid_t mem_type = H5I_INVALID_HID;  // native type of the elements (predefined: never closed)
};

}  // namespace

std::int64_t ExportItem::row_elems() const {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::size_t ExportItem::elem_bytes() const { return dtype_size(dtype); }

struct ExportReader::Impl {
  ExportMeta meta;
  ReaderLimits limits;
  std::string file_path;
  int fd = -1;
  H5Handle file;                  // kept open only when some dataset needs the H5Dread fallback
  mutable std::mutex h5_mu;  // serialises the fallback (and its hyperslab selections)
  struct ItemLoc {
    Loc data, scale;
  };
  std::unordered_map<std::string, ItemLoc> locs;  // "<checkpoint>/<rel>"
  std::int64_t n_items = 0;
  bool needs_fallback = false;

  ~Impl() {
    file.reset();
    if (fd >= 0) ::close(fd);
  }

  Status ReadAll();
  Status ReadSampler();
  Status ReadStages();
  Status ReadCheckpoint(const std::string& name);
  // An item's size in bytes, within the item limit and the file's length (else kInvalidArgument).
  Result<std::int64_t> ItemBytes(const std::string& path, const ExportItem& it) const {
    const std::int64_t bytes = BytesWithin(it.shape, static_cast<std::int64_t>(it.elem_bytes()),
                                           std::min(limits.max_item_bytes, meta.file_bytes));
    if (bytes < 0)
      return Bad(path, "shape " + ShapeText(it.shape) + " of " + std::string(dtype_name(it.dtype)) +
                           " is larger than the limit of " + std::to_string(limits.max_item_bytes) +
                           " bytes or the file's " + std::to_string(meta.file_bytes));
    return bytes;
  }
  Status ReadCheckpointAttrs(hid_t group, const std::string& name, ExportCheckpoint* out);
  Status ReadIndexed(hid_t cps, const std::vector<Link>& names);
  Result<ExportItem> ReadItem(hid_t parent, const std::string& leaf, const std::string& cp_path,
                              const std::string& rel, int stage, int layer, ItemKind kind,
                              Loc* loc);
  Status ReadScale(hid_t parent, const std::string& leaf, const std::string& path, ExportItem* item,
                   Loc* loc);
  Status Locate(hid_t ds, const std::string& path, hid_t mem_type,
                const std::vector<std::int64_t>& shape, std::int64_t bytes, Loc* loc);
  Status Read(const Loc& loc, std::int64_t row0, std::int64_t n, void* dst) const;
  const ItemLoc* Find(const ExportCheckpoint& cp, const ExportItem& item) const {
    // Called for every row block: the key is built in a reused per-thread string, not allocated.
    thread_local std::string key;
    key.assign(cp.name).append(1, '/').append(item.rel);
    auto it = locs.find(key);
    return it == locs.end() ? nullptr : &it->second;
  }
};

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

Status ExportReader::Impl::Read(const Loc& loc, std::int64_t row0, std::int64_t n,
                                void* dst) const {
  if (row0 < 0 || n < 0 || row0 > loc.rows || n > loc.rows - row0)
    return Status::InvalidArgument(
        loc.path, "rows [" + std::to_string(row0) + ", +" + std::to_string(n) +
                      ") are outside the dataset's " + std::to_string(loc.rows) + " rows");
  if (n == 0) return Status::Ok();
  if (dst == nullptr) return Status::InvalidArgument(loc.path, "null destination");
  if (loc.offset >= 0) {
    auto* p = static_cast<char*>(dst);
    auto left = static_cast<std::size_t>(n * loc.row_bytes);
    auto off = static_cast<off_t>(loc.offset + row0 * loc.row_bytes);
    while (left > 0) {
      const ssize_t r = ::pread(fd, p, left, off);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return Status::IOError(file_path, loc.path + ": read failed: " + std::strerror(errno));
      if (r == 0)
        return Status::IOError(
            file_path, loc.path + ": unexpected end of file (truncated after it was opened?)");
      p += r;
      left -= static_cast<std::size_t>(r);
      off += r;
    }
    return Status::Ok();
  }
  std::lock_guard<std::mutex> lock(h5_mu);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // per thread in thread-safe builds
  H5Handle ds(H5Dopen2(file.get(), loc.path.c_str(), H5P_DEFAULT));
  H5Handle fs(ds.valid() ? H5Dget_space(ds.get()) : H5I_INVALID_HID);
  std::vector<hsize_t> start(loc.dims.size(), 0), count = loc.dims;
  if (!count.empty()) {
    start[0] = static_cast<hsize_t>(row0);
    count[0] = static_cast<hsize_t>(n);
  }
  H5Handle ms(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  if (!fs.valid() || !ms.valid() ||
      (!count.empty() && H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start.data(), nullptr,
                                             count.data(), nullptr) < 0) ||
      H5Dread(ds.get(), loc.mem_type, ms.get(), fs.get(), H5P_DEFAULT, dst) < 0)
    return Status::IOError(file_path, loc.path + ": HDF5 failed reading rows (corrupt data?)");
  return Status::Ok();
}

Result<ExportItem> ExportReader::Impl::ReadItem(hid_t parent, const std::string& leaf,
                                                const std::string& cp_path, const std::string& rel,
                                                int stage, int layer, ItemKind kind,
                                                Loc* loc) {
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
    return Bad(path, "kind attribute '" + kind_attr + "' but the path says '" + ItemKindName(kind) +
                         "'");
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
    return Bad(path, "unknown dtype attribute '" + dtype_attr + "' (expected f32, bf16 or int8)");
  it.dtype = *dtype;
  const hid_t mem_type = ItemMemType(it.dtype);
  const bool type_ok =
      it.dtype == DType::kF32    ? cls == H5T_FLOAT && size == 4
      : it.dtype == DType::kBF16 ? is_int && size == 2 && H5Tget_sign(ft.get()) == H5T_SGN_NONE
                                 : is_int && size == 1 && H5Tget_sign(ft.get()) == H5T_SGN_2;
  if (!type_ok)
    return Bad(
        path, "dtype attribute '" + dtype_attr + "' but the dataset holds " + DescribeType(ft.get()));
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
  char expect[64];
  std::snprintf(expect, sizeof(expect), "%05d_%s", cp.window, point.c_str());
  const std::optional<CheckpointPoint> parsed = ParseCheckpointPoint(point);
  if (!parsed || cp.window < 0 || name != expect)
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
      LOCKSTEP_ASSIGN_OR_RETURN(H5Handle lg, OpenChild(sg.get(), sp + "/" + e.name, e.name, H5I_GROUP));
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

// /trace/stages into meta.windows[w].stages. Rows come in (window, stage) order, each window's
// stages numbered from 0 without gaps; anything else is a damaged file, never silently reordered.
Status ExportReader::Impl::ReadStages() {
  const hid_t f = file.get();
  const std::string path = "/trace/stages";
  if (H5Lexists(f, path.c_str(), H5P_DEFAULT) <= 0) return Status::Ok();  // written before stages were
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
  const auto n_windows = static_cast<std::int64_t>(meta.windows.size());
  LOCKSTEP_ASSIGN_OR_RETURN(auto rows, ReadTable(ds.get(), path, kTraceStageFields, limits,
                                                 n_windows * kMaxStagesPerWindow, meta.file_bytes));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const std::string at = path + " row " + std::to_string(i);
    if (r[0] < 0 || r[0] >= n_windows)
      return Bad(at, "window " + std::to_string(r[0]) + " is not one of the " + std::to_string(n_windows) +
                         " windows of /trace/windows");
    WindowRecord& w = meta.windows[static_cast<std::size_t>(r[0])];
    const bool next_window = i == 0 || r[0] > rows[i - 1][0];
    if ((!next_window && r[0] != rows[i - 1][0]) || r[1] != static_cast<std::int64_t>(w.stages.size()))
      return Bad(at, "out of order (window " + std::to_string(r[0]) + ", stage " + std::to_string(r[1]) +
                         "; rows go by window, then stage from 0)");
    for (std::size_t k = 2; k <= 4; ++k)
      if (r[k] < 0) return Bad(at, std::string("negative ") + kTraceStageFields[k].name);
    for (std::size_t k = 5; k <= 8; ++k)
      if (r[k] < -1) return Bad(at, std::string(kTraceStageFields[k].name) + " below -1 (the only unknown value)");
    if (r[9] < 0 || r[9] > 3) return Bad(at, "graph " + std::to_string(r[9]) + " (0 none, 1 eager, 2 capture, 3 replay)");
    StageTiming st;
    st.wait_ns = r[2], st.compute_ns = r[3], st.cpu_ns = r[4];
    st.dev_wait_ns = r[5], st.dev_compute_ns = r[6], st.dev_copy_ns = r[7], st.init_ns = r[8];
    st.graph = static_cast<GraphUse>(r[9] - 1);
    w.stages.push_back(st);
  }
  return Status::Ok();
}

Status ExportReader::Impl::ReadSampler() {
  const hid_t f = file.get();
  SamplerSummary& sm = meta.sampler;
  {
    const std::string path = "/trace/samples";
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
    LOCKSTEP_ASSIGN_OR_RETURN(auto rows, ReadTable(ds.get(), path, kHostSampleFields, limits,
                                                   limits.max_windows, meta.file_bytes));
    LOCKSTEP_ASSIGN_OR_RETURN(sm.interval_min_ns, IntAttr(ds.get(), path, "interval_min_ns"));
    LOCKSTEP_ASSIGN_OR_RETURN(sm.interval_median_ns, IntAttr(ds.get(), path, "interval_median_ns"));
    LOCKSTEP_ASSIGN_OR_RETURN(sm.interval_max_ns, IntAttr(ds.get(), path, "interval_max_ns"));
    LOCKSTEP_ASSIGN_OR_RETURN(sm.nvml, StrAttr(ds.get(), path, "nvml", limits.max_string_bytes));
    LOCKSTEP_ASSIGN_OR_RETURN(sm.guard, StrAttr(ds.get(), path, "guard", limits.max_string_bytes));
    sm.n_samples = static_cast<std::int64_t>(rows.size());
    sm.min_host_available_bytes = Extreme(rows, 1, false);
    sm.max_swap_used_bytes = Extreme(rows, 2, true);
    sm.max_rss_bytes = Extreme(rows, 3, true);
    UnknownLines(rows, kHostSampleFields, 0, "trace/samples", "samples", &meta.unknowns);
    const std::pair<const char*, std::int64_t> intervals[] = {
        {"interval_min_ns", sm.interval_min_ns},
        {"interval_median_ns", sm.interval_median_ns},
        {"interval_max_ns", sm.interval_max_ns}};
    for (const auto& [attr, v] : intervals)
      if (v == -1) meta.unknowns.push_back(std::string("trace/samples ") + attr);
    if (sm.nvml != "read") meta.unknowns.push_back("nvml: " + sm.nvml);
  }
  const std::string path = "/trace/device_samples";
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
  LOCKSTEP_ASSIGN_OR_RETURN(auto dev, ReadTable(ds.get(), path, kDeviceSampleFields, limits,
                                                limits.max_windows, meta.file_bytes));
  sm.n_device_samples = static_cast<std::int64_t>(dev.size());
  sm.min_device_free_bytes = Extreme(dev, 2, false);
  sm.max_temperature_c = Clamp32(Extreme(dev, 4, true));
  sm.min_sm_clock_mhz = Clamp32(Extreme(dev, 5, false));
  sm.max_sm_clock_mhz = Clamp32(Extreme(dev, 5, true));
  if (!dev.empty()) {
    sm.pcie_gen = Clamp32(dev[0][6]);
    sm.pcie_width = Clamp32(dev[0][7]);
  }
  UnknownLines(dev, kDeviceSampleFields, 0, "trace/device_samples", "samples", &meta.unknowns);
  return Status::Ok();
}

namespace {

// "stage{S}/layer{L}/<k|v|k_spec|v_spec|conv_state|ssm_state>", "stage{S}/mtp/<k|v>",
// "stage{S}/<hidden_out|logits>" -> stage, layer (-1), kind; false for anything else.
bool ParseRel(const std::string& rel, int* stage, int* layer, ItemKind* kind) {
  const auto a = rel.find('/');
  if (a == std::string::npos) return false;
  *stage = ParseIndex(rel.substr(0, a), "stage");
  if (*stage < 0) return false;
  const std::string rest = rel.substr(a + 1);
  const auto b = rest.find('/');
  if (b == std::string::npos) {
    *layer = -1;
    const std::optional<ItemKind> k = ParseItemKind(rest);
    if (k) *kind = *k;
    return k == ItemKind::kHiddenOut || k == ItemKind::kLogits;
  }
  const std::string dir = rest.substr(0, b), leaf = rest.substr(b + 1);
  if (dir == "mtp") {
    *layer = -1;
    const std::optional<ItemKind> k = ParseItemKind("mtp_" + leaf);
    if (k) *kind = *k;
    return k == ItemKind::kMtpK || k == ItemKind::kMtpV;
  }
  *layer = ParseIndex(dir, "layer");
  const std::optional<ItemKind> k = ParseItemKind(leaf);
  if (k) *kind = *k;
  return *layer >= 0 && k && IsLayerItem(*k);
}

}  // namespace

// Exports written by lockstep carry /index/items: every item's kind, dtype, shape and file offset
// in one table. Reading it replaces opening every dataset (HDF5's per-object work was ~80% of a
// diff of an export with thousands of small items). Every row is checked like a dataset would be:
// path grammar, kind/stage/layer against the path, dtype, shape within the limits, offset + size
// within the file. The first item of every checkpoint is also opened the slow way and must agree
// with its row, so a stale or foreign index is an error, not silently wrong bytes.
Status ExportReader::Impl::ReadIndexed(hid_t cps, const std::vector<Link>& names) {
  const std::string ipath = "/index/items";
  std::map<std::string, std::size_t> cp_at;
  for (const Link& l : names) {
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle g, OpenChild(cps, "/checkpoints/" + l.name, l.name, H5I_GROUP));
    ExportCheckpoint cp;
    LOCKSTEP_RETURN_IF_ERROR(ReadCheckpointAttrs(g.get(), l.name, &cp));
    cp_at[l.name] = meta.checkpoints.size();
    meta.checkpoints.push_back(std::move(cp));
  }
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

  std::set<std::string> checked;  // checkpoints whose first item was cross-checked
  for (std::size_t i = 0; i < rows.size(); ++i) {
    IndexRow& r = rows[i];
    r.checkpoint[sizeof(r.checkpoint) - 1] = r.rel[sizeof(r.rel) - 1] = r.kind[sizeof(r.kind) - 1] =
        0;
    r.dtype[sizeof(r.dtype) - 1] = 0;
    const std::string where = ipath + " row " + std::to_string(i);
    const std::string cp_name = r.checkpoint, rel = r.rel;
    auto cpi = cp_at.find(cp_name);
    if (cpi == cp_at.end())
      return Bad(where, "names checkpoint '" + cp_name + "', which /checkpoints does not hold");
    ExportCheckpoint& cp = meta.checkpoints[cpi->second];
    const std::string path = "/checkpoints/" + cp_name + "/" + rel;
    int stage = -1, layer = -1;
    ItemKind kind = ItemKind::kK;
    if (!ParseRel(rel, &stage, &layer, &kind))
      return Bad(where, "'" + rel + "' is not an item path of lockstep.export v1");
    if (ParseItemKind(r.kind) != kind || stage != r.stage || layer != r.layer)
      return Bad(path, "index row says kind " + std::string(r.kind) + " stage " +
                           std::to_string(r.stage) + " layer " + std::to_string(r.layer) +
                           ", the path says " + ItemKindName(kind) + " " + std::to_string(stage) + " " +
                           std::to_string(layer));
    ExportItem it;
    it.rel = rel;
    it.kind = kind;
    it.stage = stage;
    it.layer = layer;
    const std::optional<DType> dtype = ParseItemDtype(r.dtype);
    if (!dtype) return Bad(path, "unknown dtype '" + std::string(r.dtype) + "' in the index");
    it.dtype = *dtype;
    const hid_t mem_type = ItemMemType(it.dtype);
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
    // Offset -1: the data is not one contiguous run (chunked, e.g. --export-compress lz4): it is
    // read through HDF5 (H5Dread, which checks the selection against the real dataspace).
    auto in_file = [&](std::int64_t off, std::int64_t len) {
      return len == 0 || off == -1 || (off >= 0 && off <= meta.file_bytes && len <= meta.file_bytes - off);
    };
    if (!in_file(r.offset, bytes))
      return Bad(path, "index offset " + std::to_string(r.offset) + " lies outside the file");
    ItemLoc il;
    il.data.path = path;
    il.data.mem_type = mem_type;
    il.data.dims.assign(it.shape.begin(), it.shape.end());
    il.data.rows = it.shape[0];
    il.data.row_bytes = il.data.rows == 0 ? 0 : bytes / il.data.rows;
    il.data.offset = bytes == 0 ? 0 : r.offset;
    needs_fallback = needs_fallback || il.data.offset < 0;
    if (r.scale_offset >= 0 || it.dtype == DType::kI8) {
      if (it.dtype != DType::kI8 || it.shape.size() < 2 || r.scale_dims[0] != it.shape[0] ||
          r.scale_dims[1] != it.shape[1])
        return Bad(path,
                   "index scales do not fit the item (expected int8 with scales [rows, heads])");
      const std::int64_t sbytes =
          BytesWithin({r.scale_dims[0], r.scale_dims[1]}, 4, meta.file_bytes);
      if (sbytes < 0 || !in_file(r.scale_offset, sbytes))
        return Bad(path, "index scale offset lies outside the file");
      it.has_scales = true;
      it.scale_row_elems = r.scale_dims[1];
      il.scale.path = path + "_scale";
      il.scale.mem_type = H5T_NATIVE_FLOAT;
      il.scale.dims = {static_cast<hsize_t>(r.scale_dims[0]),
                       static_cast<hsize_t>(r.scale_dims[1])};
      il.scale.rows = r.scale_dims[0];
      il.scale.row_bytes = r.scale_dims[1] * 4;
      il.scale.offset = sbytes == 0 ? 0 : r.scale_offset;
      needs_fallback = needs_fallback || il.scale.offset < 0;
    }
    if (!locs.emplace(cp_name + "/" + rel, il).second)
      return Bad(path, "listed twice in the index");
    if (++n_items > limits.max_items)
      return Bad(ipath, "more than the limit of " + std::to_string(limits.max_items) + " items");
    if (checked.insert(cp_name).second) {
      // Cross-check against the dataset itself (the full validation of the slow path).
      const auto slash = path.find_last_of('/');
      LOCKSTEP_ASSIGN_OR_RETURN(H5Handle parent,
                                OpenObject(file.get(), path.substr(0, slash), H5I_GROUP));
      Loc loc;
      LOCKSTEP_ASSIGN_OR_RETURN(
          ExportItem full, ReadItem(parent.get(), path.substr(slash + 1), "/checkpoints/" + cp_name,
                                    rel, stage, layer, kind, &loc));
      if (full.shape != it.shape || full.dtype != it.dtype ||
          full.capacity_rows != it.capacity_rows ||
          (bytes > 0 && loc.offset >= 0 && loc.offset != il.data.offset))
        return Bad(ipath, "disagrees with dataset " + path +
                              " (a stale or foreign index): open with the index off");
    }
    cp.items.push_back(std::move(it));
  }
  for (auto& cp : meta.checkpoints)
    std::sort(cp.items.begin(), cp.items.end(), ItemOrder);
  return Status::Ok();
}

Status ExportReader::Impl::ReadAll() {
  const hid_t f = file.get();
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle root, OpenObject(f, "/", H5I_GROUP));
  // The identity check comes first: anything else about a foreign file is noise.
  {
    auto schema = StrAttr(root.get(), "/", "schema", 256);
    auto version = IntAttr(root.get(), "/", "schema_version");
    if (!schema.ok() || *schema != "lockstep.export" || !version.ok() || *version != 1)
      return Bad("/", "not a lockstep.export v1 file: schema '" +
                          (schema.ok() ? *schema : std::string("(missing)")) + "' version " +
                          (version.ok() ? std::to_string(*version) : std::string("(missing)")));
    meta.schema = *schema;
    meta.schema_version = *version;
  }
  const std::int64_t max_str = std::min(limits.max_string_bytes, meta.file_bytes);
  const std::pair<const char*, std::string*> strings[] = {
      {"arm", &meta.arm},
      {"run_id", &meta.run_id},
      {"created_utc", &meta.created_utc},
      {"executable_sha256", &meta.executable_sha256},
      {"config_sha256", &meta.config_sha256},
      {"model_sha256", &meta.model_sha256},
      {"request_sha256", &meta.request_sha256}};
  for (const auto& [name, out] : strings) {
    LOCKSTEP_ASSIGN_OR_RETURN(*out, StrAttr(root.get(), "/", name, max_str));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(meta.seed, IntAttr(root.get(), "/", "seed"));
  if (meta.executable_sha256.empty())
    meta.unknowns.push_back("executable_sha256: empty (the binary was unreadable)");
  {
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, "/config", H5I_DATASET));
    LOCKSTEP_ASSIGN_OR_RETURN(meta.config_json, ReadString(ds.get(), false, "/config", max_str));
  }
  // Token ids: integers of at most 4 bytes, read as int32.
  const auto tokens = [&](const std::string& path, std::vector<std::int32_t>* out) -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
    H5Handle ft(H5Dget_type(ds.get()));
    if (!ft.valid() || H5Tget_class(ft.get()) != H5T_INTEGER || H5Tget_size(ft.get()) > 4)
      return Bad(path, "holds " + (ft.valid() ? DescribeType(ft.get()) : std::string("?")) +
                           ", expected int32 token ids");
    LOCKSTEP_ASSIGN_OR_RETURN(auto shape, Shape(ds.get(), path, limits));
    if (shape.size() != 1)
      return Bad(path, "expected one dimension, got shape " + ShapeText(shape));
    if (shape[0] > limits.max_tokens || BytesWithin(shape, 4, meta.file_bytes) < 0)
      return Bad(path, std::to_string(shape[0]) + " token ids exceed the limit of " +
                           std::to_string(limits.max_tokens) + " or the file's size");
    out->resize(static_cast<std::size_t>(shape[0]));
    if (!out->empty() &&
        H5Dread(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) < 0)
      return Bad(path, "token ids unreadable (corrupt file?)");
    return Status::Ok();
  };
  {
    LOCKSTEP_RETURN_IF_ERROR(tokens("/request/tokens", &meta.request_tokens));
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle req, OpenObject(f, "/request", H5I_GROUP));
    LOCKSTEP_ASSIGN_OR_RETURN(meta.max_new, IntAttr(req.get(), "/request", "max_new"));
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t req_seed, IntAttr(req.get(), "/request", "seed"));
    if (req_seed != meta.seed)
      return Bad("/request", "seed attribute " + std::to_string(req_seed) +
                                 " differs from the root's " + std::to_string(meta.seed));
    LOCKSTEP_RETURN_IF_ERROR(tokens("/output/tokens", &meta.output_tokens));
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle out, OpenObject(f, "/output", H5I_GROUP));
    LOCKSTEP_ASSIGN_OR_RETURN(meta.stop_reason,
                              StrAttr(out.get(), "/output", "stop_reason", max_str));
    LOCKSTEP_ASSIGN_OR_RETURN(meta.text_sha256,
                              StrAttr(out.get(), "/output", "text_sha256", max_str));
  }
  {
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle counters, OpenObject(f, "/counters", H5I_GROUP));
    LOCKSTEP_ASSIGN_OR_RETURN(auto stages, Children(counters.get(), "/counters", limits.max_items));
    for (const Link& st : stages) {
      const std::string path = "/counters/" + st.name;
      if (ParseIndex(st.name, "stage") < 0)
        return Bad(path, "unexpected entry (expected stage{S})");
      LOCKSTEP_ASSIGN_OR_RETURN(H5Handle g, OpenObject(f, path, H5I_GROUP));
      std::vector<std::string> names;
      if (H5Aiterate2(g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, CollectAttrName, &names) != 0)
        return Bad(path, "attributes unreadable or too many of them");
      for (const char* required : kCounterAttrs)
        if (std::find(names.begin(), names.end(), required) == names.end())
          return Bad(path, std::string("missing attribute '") + required + "'");
      auto& values = meta.counters[st.name];
      for (const std::string& n : names) {
        LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t v, IntAttr(g.get(), path, n.c_str()));
        values[n] = v;
        if (v == -1) meta.unknowns.push_back("counters/" + st.name + " " + n);
      }
    }
  }
  {
    const std::string path = "/trace/windows";
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
    LOCKSTEP_ASSIGN_OR_RETURN(auto rows, ReadTable(ds.get(), path, kTraceWindowFields, limits,
                                                   limits.max_windows, meta.file_bytes));
    // Each column is the WindowRecord field of its name (window.h's table).
    std::array<const WindowField*, kTraceWindowFields.size()> fields{};
    for (std::size_t i = 0; i < fields.size(); ++i) {
      fields[i] = FindWindowField(kTraceWindowFields[i].name);
      if (fields[i] == nullptr || fields[i]->kind == WindowFieldKind::kTokens)
        return Status::Runtime(path, std::string("column '") + kTraceWindowFields[i].name +
                                         "' is no scalar field of WindowRecord");
    }
    for (const auto& r : rows) {
      WindowRecord w;
      for (std::size_t i = 0; i < fields.size(); ++i) {
        const bool narrow =
            fields[i]->kind == WindowFieldKind::kInt || fields[i]->kind == WindowFieldKind::kBool;
        if (narrow && (r[i] < INT_MIN || r[i] > INT_MAX))
          return Bad(path, std::string("field '") + kTraceWindowFields[i].name +
                               "' out of range: " + std::to_string(r[i]));
        fields[i]->set(w, r[i]);
      }
      // The trace has no `source` field; it follows from the path fields.
      w.source = w.T <= 1     ? DraftSource::kNone
                 : w.merged   ? DraftSource::kMerged
                 : w.from_sfx ? DraftSource::kSuffix
                              : DraftSource::kMtp;
      meta.windows.push_back(std::move(w));
    }
    UnknownLines(rows, kTraceWindowFields, kFirstWindowTiming, "trace/windows", "windows",
                 &meta.unknowns);
  }
  LOCKSTEP_RETURN_IF_ERROR(ReadStages());
  LOCKSTEP_RETURN_IF_ERROR(ReadSampler());
  // /checkpoints exists only when some window exported state (--export-windows none: trace only).
  if (H5Lexists(f, "/checkpoints", H5P_DEFAULT) > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle cps, OpenObject(f, "/checkpoints", H5I_GROUP));
    LOCKSTEP_ASSIGN_OR_RETURN(auto names, Children(cps.get(), "/checkpoints", limits.max_items));
    if (limits.use_index && H5Lexists(f, "/index", H5P_DEFAULT) > 0) {
      LOCKSTEP_RETURN_IF_ERROR(ReadIndexed(cps.get(), names));
    } else {
      for (const Link& l : names) LOCKSTEP_RETURN_IF_ERROR(ReadCheckpoint(l.name));
    }
    std::sort(meta.checkpoints.begin(), meta.checkpoints.end(),
              [](const ExportCheckpoint& a, const ExportCheckpoint& b) {
                return std::make_pair(a.window, a.point) < std::make_pair(b.window, b.point);
              });
  }
  return Status::Ok();
}

Result<std::unique_ptr<ExportReader>> ExportReader::Open(const std::string& path,
                                                         const ReaderLimits& limits) {
  H5Eset_auto2(H5E_DEFAULT, nullptr,
               nullptr);  // errors become Status, not stderr noise (per thread)
  auto impl = std::make_unique<Impl>();
  impl->limits = limits;
  impl->file_path = path;
  impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl->fd < 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) return Status::NotFound(path, "no such file");
    return Status::IOError(path, std::string("cannot open for reading: ") + std::strerror(e));
  }
  struct stat st;
  if (::fstat(impl->fd, &st) != 0)
    return Status::IOError(path, std::string("fstat failed: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path, "not a regular file");
  impl->meta.file_bytes = static_cast<std::int64_t>(st.st_size);
  ssize_t got = 0;
  const bool hdf5 = HasHdf5Signature(impl->fd, &got);
  if (got < 0) return Status::IOError(path, std::string("read failed: ") + std::strerror(errno));
  if (!hdf5)
    return Status::InvalidArgument(path, st.st_size == 0
                                             ? "empty file, not an HDF5 export"
                                             : "not an HDF5 file (no HDF5 signature at offset 0)");
  // A metadata cache large enough for every object header of a big export: with the default (2 MiB
  // initial) HDF5 evicted and re-read headers while we walked thousands of items.
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5AC_cache_config_t mdc;
  mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  if (fapl.valid() && H5Pget_mdc_config(fapl.get(), &mdc) >= 0) {
    mdc.set_initial_size = true;
    mdc.initial_size = std::size_t{64} << 20;
    mdc.max_size = std::max<std::size_t>(mdc.max_size, std::size_t{128} << 20);
    mdc.incr_mode = H5C_incr__off;
    mdc.decr_mode = H5C_decr__off;
    mdc.flash_incr_mode = H5C_flash_incr__off;
    H5Pset_mdc_config(fapl.get(), &mdc);
  }
  impl->file = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.valid() ? fapl.get() : H5P_DEFAULT));
  if (!impl->file.valid())
    return Status::InvalidArgument(
        path, "HDF5 cannot open it (truncated or corrupt; an unfinished export ends in .partial)");
  // pread() must read the very file HDF5 parsed (not one renamed into its place in between).
  void* handle = nullptr;
  struct stat hst;
  if (H5Fget_vfd_handle(impl->file.get(), H5P_DEFAULT, &handle) < 0 || handle == nullptr ||
      ::fstat(*static_cast<int*>(handle), &hst) != 0 || hst.st_dev != st.st_dev ||
      hst.st_ino != st.st_ino)
    return Status::IOError(path, "the file changed while it was being opened");
  if (Status s = impl->ReadAll(); !s.ok()) return s.WithContext(path);
  if (!impl->needs_fallback)
    impl->file.reset();  // every read goes through pread(): free HDF5's state
  return std::unique_ptr<ExportReader>(new ExportReader(std::move(impl)));
}

ExportReader::ExportReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExportReader::~ExportReader() = default;

const ExportMeta& ExportReader::meta() const { return impl_->meta; }

Status ExportReader::ReadRows(const ExportCheckpoint& cp, const ExportItem& item, std::int64_t row0,
                              std::int64_t n, void* dst) const {
  const Impl::ItemLoc* loc = impl_->Find(cp, item);
  if (loc == nullptr)
    return Status::InvalidArgument(cp.name + "/" + item.rel, "not an item of this export");
  return impl_->Read(loc->data, row0, n, dst);
}

Status ExportReader::ReadScaleRows(const ExportCheckpoint& cp, const ExportItem& item,
                                   std::int64_t row0, std::int64_t n, float* dst) const {
  const Impl::ItemLoc* loc = impl_->Find(cp, item);
  if (loc == nullptr)
    return Status::InvalidArgument(cp.name + "/" + item.rel, "not an item of this export");
  if (loc->scale.path.empty())
    return Status::InvalidArgument(loc->data.path, "has no scales (not an int8 item)");
  return impl_->Read(loc->scale, row0, n, dst);
}

bool ExportReader::ReadsDirectly(const ExportCheckpoint& cp, const ExportItem& item) const {
  const Impl::ItemLoc* loc = impl_->Find(cp, item);
  return loc != nullptr && loc->data.offset >= 0;
}

bool LooksLikeHdf5(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t got = 0;
  const bool hdf5 = HasHdf5Signature(fd, &got);
  ::close(fd);
  return hdf5;
}

}  // namespace lockstep
