#include "lockstep/engine/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/errno_text.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Real headers are a few hundred KB at most (one short entry per tensor); anything bigger is a
// corrupt length prefix, and parsing it would only waste memory.
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;  // 100 MiB
constexpr std::uint64_t kMaxIndexBytes = std::uint64_t{100} << 20;
// Deepest JSON nesting accepted in a header (real headers: 3; metadata values are strings).
constexpr int kMaxHeaderDepth = 8;
struct HeaderTooDeep {};  // thrown from the parser callback to stop a runaway parse

std::string FileWhat(const std::string& label) { return fmt::format("safetensors '{}'", label); }

Status TooShort(const std::string& label, std::uint64_t size) {
  return Status::Corruption(
      FileWhat(label),
      fmt::format("file is {} bytes, shorter than the 8-byte header length prefix (hint: the file "
                  "may be truncated or not a safetensors file)",
                  size));
}

// A JSON value in a message: its compact text, shortened so a hostile header cannot produce a
// megabyte-long Status.
std::string Brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 48) s = s.substr(0, 45) + "...";
  return s;
}

// A non-negative JSON integer (nlohmann stores those as unsigned), else nullopt. Floats such as
// 2.0 are rejected: shapes and offsets are integers.
std::optional<std::uint64_t> NonNegativeInt(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if (i >= 0) return static_cast<std::uint64_t>(i);
  }
  return std::nullopt;
}

// "[2, 3]". Built by hand rather than with fmt::join, whose runtime spec parsing trips a
// -Wstringop-overflow false positive in fmt 9 under g++ 12 -fsanitize=address.
std::string ShapeText(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

// Every safetensors dtype name we accept, for the "unknown dtype" message.
std::string KnownDtypes() {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8,
                       DType::kU8,  DType::kI32, DType::kI64,  DType::kBool};
  std::string s;
  for (DType t : all) {
    if (!s.empty()) s += ", ";
    s += dtype_safetensors_name(t);
  }
  return s;
}

// One tensor's byte range inside the data section, for the overlap check.
struct Range {
  std::uint64_t begin;
  std::uint64_t end;
  const std::string* name;
};

// ---- SafetensorsFile::Parse's steps, in the order it runs them ----
// Each returns the first error it finds. The steps that touch JSON may throw: they run inside
// Parse's try, which turns anything thrown into a Status (STYLE C.13).

// The 8-byte little-endian header length, checked against the bytes that follow and the limit.
Status ReadHeaderLength(std::span<const std::byte> bytes, const std::string& what,
                        std::uint64_t* n_out) {
  // Assembled byte by byte (host-endian independent).
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<std::uint64_t>(bytes[static_cast<std::size_t>(i)]);
  }
  const std::uint64_t after_prefix = bytes.size() - 8;
  if (n > after_prefix) {
    return Status::Corruption(
        what, fmt::format("header length {} (from the first 8 bytes) is larger than the {} bytes "
                          "that follow (hint: the file may be truncated or not a safetensors "
                          "file)",
                          n, after_prefix));
  }
  if (n > kMaxHeaderBytes) {
    return Status::Corruption(
        what, fmt::format("header length {} is larger than the {} byte limit (hint: the length "
                          "prefix is probably corrupt)",
                          n, kMaxHeaderBytes));
  }
  *n_out = n;
  return Status::Ok();
}

// The header text as a JSON object, refusing runaway nesting and repeated top-level keys.
Status ParseHeaderJson(const char* begin, std::uint64_t n, const std::string& what,
                       json* header_out) {
  // JSON objects may repeat a key and nlohmann keeps the last one; a repeated tensor name
  // would silently drop a tensor, so the parser callback records top-level duplicates.
  std::set<std::string, std::less<>> seen;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    // A real header nests 3 deep (object, entry, shape); "[[[[..." would otherwise cost
    // gigabytes of memory and seconds per 100 MiB header. Thrown, caught just below.
    if (depth > kMaxHeaderDepth) throw HeaderTooDeep{};
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(begin, begin + n, on_event);
  } catch (const HeaderTooDeep&) {
    return Status::Corruption(
        what, fmt::format("header JSON nests deeper than {} levels, expected tensor entries",
                          kMaxHeaderDepth));
  } catch (const json::parse_error& e) {
    return Status::Corruption(what, fmt::format("header is not valid JSON: {} (hint: the file "
                                                "may be truncated or not a safetensors file)",
                                                e.what()));
  }
  if (!duplicate.empty()) {
    return Status::Corruption(what, fmt::format("header lists '{}' twice", duplicate));
  }
  if (!header.is_object()) {
    return Status::Corruption(
        what, fmt::format("header is a JSON {}, expected an object of tensor entries",
                          header.type_name()));
  }
  *header_out = std::move(header);
  return Status::Ok();
}

// "__metadata__": an object of strings, added to *metadata.
Status ReadMetadata(const json& entry, const std::string& what,
                    std::map<std::string, std::string>* metadata) {
  if (!entry.is_object()) {
    return Status::Corruption(
        what,
        fmt::format("__metadata__ is a JSON {}, expected an object of strings", entry.type_name()));
  }
  for (const auto& [mkey, mval] : entry.items()) {
    if (!mval.is_string()) {
      return Status::Corruption(
          what, fmt::format("__metadata__ key '{}': value {} is a JSON {}, expected a "
                            "string",
                            mkey, Brief(mval), mval.type_name()));
    }
    (*metadata)[mkey] = mval.get<std::string>();
  }
  return Status::Ok();
}

// An entry's "dtype": a string naming a dtype we know. `tw` names the tensor in messages.
Status ReadDtype(const json& entry, const std::string& what, const std::string& tw,
                 DType* dtype_out, std::string* text_out) {
  const auto dt_it = entry.find("dtype");
  if (dt_it == entry.end() || !dt_it->is_string()) {
    return Status::Corruption(
        what, fmt::format("{}: \"dtype\" is {}, expected a string such as \"BF16\"", tw,
                          dt_it == entry.end() ? std::string("missing") : Brief(*dt_it)));
  }
  const auto& dtype_text = dt_it->get_ref<const std::string&>();
  const std::optional<DType> dtype = dtype_from_safetensors(dtype_text);
  if (!dtype) {
    return Status::Corruption(what, fmt::format("{}: unknown dtype '{}' (expected one of {})", tw,
                                                dtype_text, KnownDtypes()));
  }
  *dtype_out = *dtype;
  *text_out = dtype_text;
  return Status::Ok();
}

// An entry's "shape": non-negative integers whose product (and byte size) fits in 63 bits.
Status ReadShape(const json& entry, DType dtype, const std::string& what, const std::string& tw,
                 std::vector<std::int64_t>* shape_out, std::uint64_t* nbytes_out) {
  const auto sh_it = entry.find("shape");
  if (sh_it == entry.end() || !sh_it->is_array()) {
    return Status::Corruption(
        what, fmt::format("{}: \"shape\" is {}, expected an array of non-negative integers", tw,
                          sh_it == entry.end() ? std::string("missing") : Brief(*sh_it)));
  }
  std::vector<std::int64_t> shape;
  shape.reserve(sh_it->size());
  std::uint64_t numel = 1;
  bool too_big = false;
  constexpr auto kI64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::size_t i = 0; i < sh_it->size(); ++i) {
    const json& d = (*sh_it)[i];
    const std::optional<std::uint64_t> v = NonNegativeInt(d);
    if (!v || *v > kI64Max) {
      return Status::Corruption(
          what, fmt::format("{}: shape[{}] is {}, expected a non-negative integer (shape {})", tw,
                            i, Brief(d), Brief(*sh_it)));
    }
    shape.push_back(static_cast<std::int64_t>(*v));
    if (__builtin_mul_overflow(numel, *v, &numel) || numel > kI64Max) too_big = true;
  }
  std::uint64_t nbytes = 0;
  if (too_big || __builtin_mul_overflow(numel, dtype_size(dtype), &nbytes) || nbytes > kI64Max) {
    return Status::Corruption(
        what,
        fmt::format("{}: shape {} has more elements than can be addressed", tw, Brief(*sh_it)));
  }
  *shape_out = std::move(shape);
  *nbytes_out = nbytes;
  return Status::Ok();
}

// An entry's "data_offsets": [begin, end) inside the data section (data_size bytes), exactly
// nbytes long. dtype_text and shape only describe the tensor in the message.
Status ReadOffsets(const json& entry, std::uint64_t data_size, std::uint64_t nbytes,
                   const std::string& dtype_text, const std::vector<std::int64_t>& shape,
                   const std::string& what, const std::string& tw, Range* range_out) {
  const auto off_it = entry.find("data_offsets");
  std::optional<std::uint64_t> begin;
  std::optional<std::uint64_t> end;
  if (off_it != entry.end() && off_it->is_array() && off_it->size() == 2) {
    begin = NonNegativeInt((*off_it)[0]);
    end = NonNegativeInt((*off_it)[1]);
  }
  if (!begin || !end) {
    return Status::Corruption(
        what, fmt::format("{}: \"data_offsets\" is {}, expected [begin, end] with two "
                          "non-negative integers",
                          tw, off_it == entry.end() ? std::string("missing") : Brief(*off_it)));
  }
  if (*begin > *end) {
    return Status::Corruption(
        what, fmt::format("{}: data_offsets [{}, {}) has begin after end", tw, *begin, *end));
  }
  if (*end > data_size) {
    return Status::Corruption(
        what, fmt::format("{}: data_offsets [{}, {}) past the end of the data section (size "
                          "{}) (hint: the file may be truncated)",
                          tw, *begin, *end, data_size));
  }
  if (*end - *begin != nbytes) {
    return Status::Corruption(
        what, fmt::format("{}: data_offsets [{}, {}) span {} bytes, expected {} bytes for "
                          "{} {}",
                          tw, *begin, *end, *end - *begin, nbytes, dtype_text, ShapeText(shape)));
  }
  *range_out = Range{*begin, *end, nullptr};
  return Status::Ok();
}

// One tensor entry (everything but "__metadata__"): dtype, shape, then offsets into `data`.
Status ReadTensorEntry(const std::string& key, const json& entry, const std::byte* data,
                       std::uint64_t data_size, const std::string& file, const std::string& what,
                       TensorInfo* info_out, Range* range_out) {
  const std::string tw = fmt::format("tensor '{}'", key);
  if (!entry.is_object()) {
    return Status::Corruption(
        what, fmt::format("{}: entry is a JSON {}, expected an object with dtype, shape and "
                          "data_offsets",
                          tw, entry.type_name()));
  }
  DType dtype{};
  std::string dtype_text;
  LOCKSTEP_RETURN_IF_ERROR(ReadDtype(entry, what, tw, &dtype, &dtype_text));
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes = 0;
  LOCKSTEP_RETURN_IF_ERROR(ReadShape(entry, dtype, what, tw, &shape, &nbytes));
  Range range{};
  LOCKSTEP_RETURN_IF_ERROR(
      ReadOffsets(entry, data_size, nbytes, dtype_text, shape, what, tw, &range));

  TensorInfo info;
  info.name = key;
  info.dtype = dtype;
  info.shape = std::move(shape);
  info.data = data + range.begin;
  info.nbytes = static_cast<std::size_t>(nbytes);
  info.file = file;
  *info_out = std::move(info);
  *range_out = range;
  return Status::Ok();
}

// Overlap check: sorted by begin, each non-empty range must start at or after the end of the
// previous non-empty one. Empty tensors occupy no bytes and may sit anywhere.
Status CheckNoOverlap(std::vector<Range> ranges, const std::string& what) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev != nullptr && r.begin < prev->end) {
      return Status::Corruption(
          what, fmt::format("tensor '{}': data_offsets [{}, {}) overlap tensor '{}' [{}, {})",
                            *r.name, r.begin, r.end, *prev->name, prev->begin, prev->end));
    }
    prev = &r;
  }
  return Status::Ok();
}

}  // namespace

// ---- TensorInfo ----

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile ----

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status::NotFound(fmt::format("safetensors file '{}'", path), "does not exist");
    }
    return Status::IOError(fmt::format("opening safetensors '{}'", path), ErrnoText(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(fmt::format("opening safetensors '{}'", path),
                           fmt::format("fstat: {}", ErrnoText(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IOError(fmt::format("opening safetensors '{}'", path),
                           "not a regular file (a folder or device?)");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) {  // also covers the empty file, which mmap() would refuse with EINVAL
    ::close(fd);
    return TooShort(path, size);
  }
  void* map = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (map == MAP_FAILED) {
    return Status::IOError(fmt::format("opening safetensors '{}'", path),
                           fmt::format("mmap of {} bytes: {}", size, ErrnoText(map_err)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;  // owned from here on: the destructor unmaps, on error paths too
  file->map_size_ = static_cast<std::size_t>(size);
  LOCKSTEP_RETURN_IF_ERROR(
      file->Parse(std::span<const std::byte>(static_cast<const std::byte*>(map), file->map_size_)));
  return file;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromMemory(
    std::span<const std::byte> bytes, std::string label) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(label);
  LOCKSTEP_RETURN_IF_ERROR(file->Parse(bytes));
  return file;
}

Status SafetensorsFile::Parse(std::span<const std::byte> bytes) {
  const std::string what = FileWhat(path_);
  if (bytes.size() < 8) return TooShort(path_, bytes.size());
  std::uint64_t n = 0;
  LOCKSTEP_RETURN_IF_ERROR(ReadHeaderLength(bytes, what, &n));
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  const std::byte* data = bytes.data() + 8 + n;
  const std::uint64_t data_size = bytes.size() - 8 - n;

  // nlohmann::json throws; nothing thrown may leave this function (STYLE C.13). The whole
  // validation sits in the try so that a surprise (e.g. a type_error) is still a Status.
  try {
    json header;
    LOCKSTEP_RETURN_IF_ERROR(ParseHeaderJson(header_begin, n, what, &header));
    std::vector<TensorInfo> tensors;
    std::vector<Range> ranges;
    tensors.reserve(header.size());
    ranges.reserve(header.size());
    for (const auto& [key, entry] : header.items()) {
      if (key == "__metadata__") {
        LOCKSTEP_RETURN_IF_ERROR(ReadMetadata(entry, what, &metadata_));
        continue;
      }
      TensorInfo info;
      Range range{};
      LOCKSTEP_RETURN_IF_ERROR(
          ReadTensorEntry(key, entry, data, data_size, path_, what, &info, &range));
      tensors.push_back(std::move(info));
      ranges.push_back(range);
    }
    // Names point into `tensors`, which no longer grows.
    for (std::size_t i = 0; i < ranges.size(); ++i) ranges[i].name = &tensors[i].name;
    LOCKSTEP_RETURN_IF_ERROR(CheckNoOverlap(std::move(ranges), what));

    std::sort(tensors.begin(), tensors.end(),
              [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
    tensors_ = std::move(tensors);
  } catch (const json::exception& e) {
    return Status::Corruption(what, fmt::format("malformed header: {}", e.what()));
  } catch (const std::bad_alloc&) {
    return Status::Runtime(what, "out of memory while parsing the header");
  }
  return Status::Ok();
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  const auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const TensorInfo& t, std::string_view n) { return std::string_view(t.name) < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

// ---- TensorStore ----

Result<std::unique_ptr<TensorStore>> TensorStore::OpenDir(const std::string& dir) {
  const std::string what = fmt::format("checkpoint folder '{}'", dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound(what, "does not exist or is not a folder");
  }
  auto store = std::make_unique<TensorStore>();
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";

  if (fs::exists(index_path, ec)) {
    const std::string iw = fmt::format("safetensors index '{}'", index_path.string());
    LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(index_path.string(), kMaxIndexBytes));
    json index;
    try {
      index = json::parse(text);
    } catch (const json::exception& e) {
      return Status::Corruption(iw, fmt::format("not valid JSON: {}", e.what()));
    }
    const auto wm_it = index.is_object() ? index.find("weight_map") : index.end();
    if (!index.is_object() || wm_it == index.end() || !wm_it->is_object()) {
      return Status::Corruption(
          iw, "expected a JSON object with a \"weight_map\" object (tensor name -> shard file)");
    }
    // name -> shard, validated; shards opened once each, in sorted order.
    std::map<std::string, std::string> weight_map;
    std::map<std::string, std::string> first_name_of_shard;
    for (const auto& [name, shard_json] : wm_it->items()) {
      if (!shard_json.is_string()) {
        return Status::Corruption(
            iw, fmt::format("weight_map['{}'] is {}, expected a shard file name (string)", name,
                            Brief(shard_json)));
      }
      const auto& shard = shard_json.get_ref<const std::string&>();
      const fs::path sp(shard);
      const bool escapes =
          std::any_of(sp.begin(), sp.end(), [](const fs::path& part) { return part == ".."; });
      if (shard.empty() || sp.is_absolute() || escapes) {
        return Status::Corruption(
            iw, fmt::format("weight_map['{}'] = '{}', expected a file name inside the folder", name,
                            shard));
      }
      weight_map.emplace(name, shard);
      first_name_of_shard.emplace(shard, name);
    }
    std::map<std::string, const SafetensorsFile*> by_shard;
    for (const auto& [shard, first_name] : first_name_of_shard) {
      const std::string full = (root / shard).string();
      if (!fs::exists(full, ec)) {
        return Status::NotFound(
            fmt::format("shard '{}'", shard),
            fmt::format("listed in '{}' (e.g. for tensor '{}') is missing from '{}' (hint: the "
                        "download may be incomplete)",
                        index_path.string(), first_name, dir));
      }
      auto file = SafetensorsFile::Open(full);
      if (!file.ok()) return file.status().WithContext(iw);
      by_shard[shard] = file->get();
      store->files_.push_back(std::move(file).value());
      store->file_paths_.push_back(full);
    }
    for (const auto& [name, shard] : weight_map) {
      if (by_shard.at(shard)->Find(name) == nullptr) {
        return Status::Corruption(
            iw, fmt::format("weight_map puts tensor '{}' in shard '{}', but that shard has no such "
                            "tensor (hint: the index and the shards come from different "
                            "checkpoints)",
                            name, shard));
      }
    }
  } else if (fs::exists(single_path, ec)) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path.string()));
    store->files_.push_back(std::move(file));
    store->file_paths_.push_back(single_path.string());
  } else {
    std::vector<std::string> found;
    fs::directory_iterator it(root, ec);
    if (ec) return Status::IOError(what, fmt::format("cannot list: {}", ec.message()));
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      // is_regular_file follows symlinks (Hugging Face caches link blobs into snapshots).
      if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) {
        found.push_back(it->path().string());
      }
    }
    if (ec) return Status::IOError(what, fmt::format("cannot list: {}", ec.message()));
    if (found.empty()) {
      return Status::NotFound(what,
                              "no model.safetensors, model.safetensors.index.json or "
                              "*.safetensors (hint: create one with 'lockstep model init')");
    }
    std::sort(found.begin(), found.end());
    for (const std::string& path : found) {
      LOCKSTEP_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
      store->files_.push_back(std::move(file));
      store->file_paths_.push_back(path);
    }
  }

  for (const SafetensorsFilePtr& file : store->files_) {
    for (const TensorInfo& t : file->tensors()) {
      const auto [pos, inserted] = store->index_.emplace(t.name, &t);
      if (!inserted) {
        return Status::Corruption(
            what, fmt::format("tensor '{}' is in both '{}' and '{}' (hint: remove the stray "
                              "file, or add a model.safetensors.index.json)",
                              t.name, pos->second->file, t.file));
      }
    }
  }
  return store;
}

const TensorInfo* TensorStore::Find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> TensorStore::Names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& entry : index_) names.push_back(entry.first);
  return names;
}

// ---- writing ----

Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata) {
  const std::string what = fmt::format("writing safetensors '{}'", path);

  // Validate everything before the temporary file is created.
  std::vector<const TensorToWrite*> order;
  std::vector<std::uint64_t> sizes;  // bytes, parallel to `tensors`
  order.reserve(tensors.size());
  sizes.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return Status::InvalidArgument(what,
                                     fmt::format("tensor name '{}' is reserved or empty", t.name));
    }
    std::uint64_t numel = 1;
    for (std::int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel)) {
        return Status::InvalidArgument(
            what, fmt::format("tensor '{}': shape {} has a negative or oversized dimension", t.name,
                              ShapeText(t.shape)));
      }
    }
    std::uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, dtype_size(t.dtype), &nbytes) || nbytes != t.data.size()) {
      return Status::InvalidArgument(
          what, fmt::format("tensor '{}': {} {} needs {} bytes, got {}", t.name,
                            dtype_name(t.dtype), ShapeText(t.shape), nbytes, t.data.size()));
    }
    order.push_back(&t);
    sizes.push_back(nbytes);
  }
  std::vector<std::size_t> idx(tensors.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(),
            [&](std::size_t a, std::size_t b) { return order[a]->name < order[b]->name; });
  for (std::size_t i = 1; i < idx.size(); ++i) {
    if (order[idx[i]]->name == order[idx[i - 1]]->name) {
      return Status::InvalidArgument(
          what, fmt::format("tensor '{}' is given twice", order[idx[i]]->name));
    }
  }

  // Header: keys in sorted order (nlohmann's object is a std::map), compact, padded with
  // spaces so the data section starts 8-byte aligned. Same input -> same bytes.
  std::string text;
  try {
    json header = json::object();
    std::uint64_t offset = 0;
    for (std::size_t i : idx) {
      const TensorToWrite& t = *order[i];
      json entry = json::object();
      entry["dtype"] = std::string(dtype_safetensors_name(t.dtype));
      entry["shape"] = t.shape;
      entry["data_offsets"] = json::array({offset, offset + sizes[i]});
      header[t.name] = std::move(entry);
      offset += sizes[i];
    }
    if (!metadata.empty()) header["__metadata__"] = metadata;
    text = header.dump();
  } catch (const json::exception& e) {
    return Status::InvalidArgument(
        what,
        fmt::format("cannot encode the header (names and metadata must be UTF-8): {}", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::byte prefix[8];
  for (std::size_t i = 0; i < 8; ++i) {
    prefix[i] =
        static_cast<std::byte>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xffu);
  }

  // Stream the pieces: a 400 MB checkpoint is never assembled in memory.
  LOCKSTEP_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  LOCKSTEP_RETURN_IF_ERROR(writer.Append(std::span<const std::byte>(prefix, 8)));
  LOCKSTEP_RETURN_IF_ERROR(writer.Append(std::string_view(text)));
  for (std::size_t i : idx) LOCKSTEP_RETURN_IF_ERROR(writer.Append(order[i]->data));
  return writer.Commit();
}

}  // namespace lockstep
