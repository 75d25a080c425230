// Bounded HDF5 readers of the export reader (see h5_bounded.h).
#include "h5_bounded.h"

#include <unistd.h>

#include <array>
#include <charconv>
#include <climits>
#include <cstring>

namespace lockstep {

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

// "stage12" -> 12 (digits only, no sign, fits an int); -1 otherwise.
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

namespace {
herr_t CollectLink(hid_t, const char* name, const H5L_info_t* info, void* data) {
  static_cast<std::vector<Link>*>(data)->push_back({name, info->type});
  return 0;
}
}  // namespace

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

Status ReadStringList(hid_t f, const char* name, std::int64_t max_bytes,
                      std::vector<std::string>* out) {
  if (H5Lexists(f, name, H5P_DEFAULT) <= 0) return Status::Ok();
  const std::string what = std::string("/") + name;
  H5Handle ds(H5Dopen2(f, name, H5P_DEFAULT));
  H5Handle ft(ds.valid() ? H5Dget_type(ds.get()) : H5I_INVALID_HID);
  H5Handle sp(ds.valid() ? H5Dget_space(ds.get()) : H5I_INVALID_HID);
  if (!ft.valid() || !sp.valid() || H5Tget_class(ft.get()) != H5T_STRING ||
      H5Tis_variable_str(ft.get()) != 0 || H5Sget_simple_extent_ndims(sp.get()) != 1)
    return Bad(what, "expected a 1-D dataset of fixed-length strings");
  const std::size_t width = H5Tget_size(ft.get());
  const hssize_t n = H5Sget_simple_extent_npoints(sp.get());
  if (width == 0 || n < 0 || n > 4096 ||
      static_cast<double>(width) * static_cast<double>(n) > static_cast<double>(max_bytes))
    return Bad(what, std::to_string(n) + " records of " + std::to_string(width) +
                         " bytes exceed the limits");
  H5Handle mt(H5Tcopy(H5T_C_S1));
  H5Tset_size(mt.get(), width);
  H5Tset_strpad(mt.get(), H5T_STR_NULLPAD);
  std::string buf(width * static_cast<std::size_t>(n), '\0');
  if (n > 0 && H5Dread(ds.get(), mt.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
    return Bad(what, "unreadable (corrupt file?)");
  for (hssize_t i = 0; i < n; ++i) {
    const char* p = buf.data() + static_cast<std::size_t>(i) * width;
    out->emplace_back(p, strnlen(p, width));
  }
  return Status::Ok();
}

}  // namespace lockstep
