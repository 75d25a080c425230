// GGUF reading and writing (gguf.h). The parser walks the header with a bounds-checked cursor:
// nothing is read, allocated or indexed before its size has been checked against what remains.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/errno_text.h"
#include "lockstep/engine/gguf.h"

namespace lockstep {

namespace {

// Limits far above any real checkpoint (a 1T-parameter model has ~10^5 tensors and ~50 keys; the
// largest value is the tokenizer's merges array of ~10^6 strings).
constexpr std::uint64_t kMaxTensors = std::uint64_t{1} << 20;
constexpr std::uint64_t kMaxKv = std::uint64_t{1} << 16;
constexpr std::uint64_t kMaxString = std::uint64_t{1} << 26;  // 64 MiB
constexpr std::uint64_t kMaxArray = std::uint64_t{1} << 28;
// All metadata array elements of a file together (issue 43): each is held as a GgufValue (~100
// bytes with the map's share), so a 16 Mi-element u8 array nobody reads took 1.63 GB and 8 s.
// 4 Mi elements is ~10x the largest real tokenizer (151,669 tokens + 151,387 merges in Qwen3's
// GGUFs, ~2.6e5 in Gemma's); past it the file is refused at the array's header (exit 2).
constexpr std::uint64_t kMaxArrayElements = std::uint64_t{1} << 22;
constexpr int kMaxArrayDepth = 2;
constexpr std::uint32_t kMaxDims = 4;
constexpr std::uint64_t kMaxAlignment = std::uint64_t{1} << 16;

struct TypeInfo {
  std::uint32_t id;
  const char* name;
  std::uint32_t block_elems;
  std::uint32_t block_bytes;
};

// ggml's type table (block size in elements, bytes per block), enough to size and bound every
// tensor of a file even when the engine does not compute with its type.
constexpr TypeInfo kTypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};

const TypeInfo* TypeOf(std::uint32_t id) {
  for (const TypeInfo& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

// Reads little-endian values from [0, size) of `p`; every read checks the bytes that remain.
class Cursor {
 public:
  Cursor(const std::byte* p, std::uint64_t size, std::string what)
      : p_(p), size_(size), what_(std::move(what)) {}
  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return size_ - pos_; }
  std::uint64_t array_elements = 0;  // read so far in this file (kMaxArrayElements)

  Status Need(std::uint64_t n, std::string_view item) const {
    if (n > left())
      return Status::Corruption(
          what_, fmt::format("truncated: {} needs {} bytes at offset {}, {} remain (hint: the "
                             "file may be cut short)",
                             item, n, pos_, left()));
    return Status::Ok();
  }
  template <class T>
  Status Read(T* out, std::string_view item) {
    LOCKSTEP_RETURN_IF_ERROR(Need(sizeof(T), item));
    std::memcpy(out, p_ + pos_, sizeof(T));  // GGUF is little-endian, as every host we build for
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, std::string_view item) {
    std::uint64_t n = 0;
    LOCKSTEP_RETURN_IF_ERROR(Read(&n, item));
    if (n > kMaxString)
      return Status::Corruption(what_, fmt::format("{}: string length {} is over the {} byte "
                                                   "limit (hint: a corrupt length)",
                                                   item, n, kMaxString));
    LOCKSTEP_RETURN_IF_ERROR(Need(n, item));
    out->assign(reinterpret_cast<const char*>(p_ + pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return Status::Ok();
  }
  const std::string& what() const { return what_; }

 private:
  const std::byte* p_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  std::string what_;
};

// Bytes one scalar of value type `t` occupies (0 for strings, arrays and unknown types).
std::uint64_t ScalarBytes(std::uint32_t t) {
  switch (t) {
    case 0:
    case 1:
    case 7:
      return 1;
    case 2:
    case 3:
      return 2;
    case 4:
    case 5:
    case 6:
      return 4;
    case 10:
    case 11:
    case 12:
      return 8;
    default:
      return 0;
  }
}

template <class T>
Status ReadScalar(Cursor& c, std::string_view item, T* out) {
  return c.Read(out, item);
}

Status ReadValue(Cursor& c, std::uint32_t type, int depth, const std::string& item, GgufValue* out);

Status ReadArray(Cursor& c, int depth, const std::string& item, GgufValue* out) {
  if (depth >= kMaxArrayDepth)
    return Status::Corruption(
        c.what(), fmt::format("{}: arrays nested deeper than {}", item, kMaxArrayDepth));
  std::uint32_t et = 0;
  std::uint64_t n = 0;
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&et, item + " element type"));
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&n, item + " element count"));
  // Every element takes at least one byte (strings: 8): a count past what remains is corrupt.
  const std::uint64_t min_elem = et == 8   ? 8
                                 : et == 9 ? 12
                                           : std::max<std::uint64_t>(1, ScalarBytes(et));
  if (et != 8 && et != 9 && ScalarBytes(et) == 0)
    return Status::Corruption(c.what(), fmt::format("{}: unknown array element type {}", item, et));
  if (n > kMaxArray || n > c.left() / min_elem)
    return Status::Corruption(
        c.what(), fmt::format("{}: array of {} elements does not fit in the {} bytes that remain",
                              item, n, c.left()));
  c.array_elements += n;
  if (c.array_elements > kMaxArrayElements)
    return Status::Corruption(
        c.what(), fmt::format("{}: metadata arrays hold more than {} elements in all (this one "
                              "has {}): refused before reading them",
                              item, kMaxArrayElements, n));
  std::vector<GgufValue> v;
  v.reserve(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) {
    GgufValue e;
    LOCKSTEP_RETURN_IF_ERROR(ReadValue(c, et, depth + 1, item, &e));
    v.push_back(std::move(e));
  }
  out->v = std::move(v);
  return Status::Ok();
}

Status ReadValue(Cursor& c, std::uint32_t type, int depth, const std::string& item,
                 GgufValue* out) {
  out->type = type;
  switch (type) {
    case 0: {
      std::uint8_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = std::uint64_t{x};
      return Status::Ok();
    }
    case 1: {
      std::int8_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = std::int64_t{x};
      return Status::Ok();
    }
    case 2: {
      std::uint16_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = std::uint64_t{x};
      return Status::Ok();
    }
    case 3: {
      std::int16_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = std::int64_t{x};
      return Status::Ok();
    }
    case 4: {
      std::uint32_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = std::uint64_t{x};
      return Status::Ok();
    }
    case 5: {
      std::int32_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = std::int64_t{x};
      return Status::Ok();
    }
    case 6: {
      float x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = double{x};
      return Status::Ok();
    }
    case 7: {
      std::uint8_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      if (x > 1) return Status::Corruption(c.what(), fmt::format("{}: bool value {}", item, x));
      out->v = x == 1;
      return Status::Ok();
    }
    case 8: {
      std::string s;
      LOCKSTEP_RETURN_IF_ERROR(c.ReadString(&s, item));
      out->v = std::move(s);
      return Status::Ok();
    }
    case 9:
      return ReadArray(c, depth, item, out);
    case 10: {
      std::uint64_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = x;
      return Status::Ok();
    }
    case 11: {
      std::int64_t x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = x;
      return Status::Ok();
    }
    case 12: {
      double x;
      LOCKSTEP_RETURN_IF_ERROR(c.Read(&x, item));
      out->v = x;
      return Status::Ok();
    }
    default:
      return Status::Corruption(c.what(), fmt::format("{}: unknown value type {}", item, type));
  }
}

// One tensor info: name, dims, type, offset; sizes checked (not yet against the data section).
Status ReadTensorInfo(Cursor& c, std::uint64_t index, GgufTensor* t) {
  const std::string item = fmt::format("tensor info {}", index);
  LOCKSTEP_RETURN_IF_ERROR(c.ReadString(&t->name, item + " name"));
  const std::string tw = fmt::format("tensor '{}'", t->name);
  if (t->name.empty()) return Status::Corruption(c.what(), item + ": empty tensor name");
  std::uint32_t n_dims = 0;
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&n_dims, tw + " n_dims"));
  if (n_dims == 0 || n_dims > kMaxDims)
    return Status::Corruption(
        c.what(), fmt::format("{}: {} dimensions, expected 1 to {}", tw, n_dims, kMaxDims));
  std::uint64_t numel = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    std::uint64_t ne = 0;
    LOCKSTEP_RETURN_IF_ERROR(c.Read(&ne, tw + " dimension"));
    if (ne == 0 || __builtin_mul_overflow(numel, ne, &numel) || numel > (std::uint64_t{1} << 48))
      return Status::Corruption(c.what(), fmt::format("{}: dimension {} = {} is zero or makes the "
                                                      "tensor too large to address",
                                                      tw, d, ne));
    t->ne.push_back(ne);
  }
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&t->type, tw + " type"));
  const TypeInfo* ti = TypeOf(t->type);
  if (ti == nullptr)
    return Status::Corruption(c.what(), fmt::format("{}: unknown ggml type id {}", tw, t->type));
  if (t->ne[0] % ti->block_elems != 0)
    return Status::Corruption(
        c.what(), fmt::format("{}: row of {} elements is not a whole number of {} blocks ({})", tw,
                              t->ne[0], ti->name, ti->block_elems));
  t->nbytes = numel / ti->block_elems * ti->block_bytes;
  return c.Read(&t->offset, tw + " offset");
}

// Offsets: aligned, inside the data section, not overlapping.
Status PlaceTensors(std::vector<GgufTensor>& ts, const std::byte* data, std::uint64_t data_size,
                    std::uint64_t alignment, const std::string& what) {
  std::vector<const GgufTensor*> order;
  for (GgufTensor& t : ts) {
    const std::string tw = fmt::format("tensor '{}'", t.name);
    if (t.offset % alignment != 0)
      return Status::Corruption(what, fmt::format("{}: offset {} is not a multiple of the "
                                                  "alignment {}",
                                                  tw, t.offset, alignment));
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      return Status::Corruption(
          what, fmt::format("{}: data [{}, {}) past the end of the data section ({} bytes) "
                            "(hint: the file may be truncated)",
                            tw, t.offset, t.offset + t.nbytes, data_size));
    t.data = data + t.offset;
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
      return Status::Corruption(
          what,
          fmt::format("tensor '{}' at [{}, {}) overlaps tensor '{}' at [{}, {})", order[i]->name,
                      order[i]->offset, order[i]->offset + order[i]->nbytes, order[i - 1]->name,
                      order[i - 1]->offset, order[i - 1]->offset + order[i - 1]->nbytes));
  return Status::Ok();
}

}  // namespace

std::string GgmlTypeName(std::uint32_t id) {
  const TypeInfo* t = TypeOf(id);
  return t ? t->name : fmt::format("type {}", id);
}

std::optional<WeightType> WeightTypeOfGgml(std::uint32_t id) {
  for (int i = 0; i < kWeightTypeCount; ++i) {
    const auto t = static_cast<WeightType>(i);
    if (weight_type_ggml_id(t) == id) return t;
  }
  return std::nullopt;
}

GgmlType GgmlOfWeightType(WeightType t) { return static_cast<GgmlType>(weight_type_ggml_id(t)); }

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const std::string what = fmt::format("GGUF '{}'", path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      return Status::NotFound(fmt::format("GGUF file '{}'", path), "does not exist");
    return Status::IOError(what, ErrnoText(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IOError(what, "not a readable regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  if (size > 0) {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (map == MAP_FAILED) return Status::IOError(what, fmt::format("mmap: {}", ErrnoText(err)));
    f->map_ = map;
    f->map_size_ = size;
  } else {
    ::close(fd);
  }
  LOCKSTEP_RETURN_IF_ERROR(
      f->Parse(std::span<const std::byte>(static_cast<const std::byte*>(f->map_), size)));
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::FromMemory(std::span<const std::byte> bytes,
                                                       std::string label) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(label);
  LOCKSTEP_RETURN_IF_ERROR(f->Parse(bytes));
  return f;
}

Status GgufFile::Parse(std::span<const std::byte> bytes) {
  Cursor c(bytes.data(), bytes.size(), fmt::format("GGUF '{}'", path_));
  std::uint32_t magic = 0;
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != 0x46554747u)  // "GGUF"
    return Status::Corruption(c.what(), "bad magic (expected \"GGUF\"): not a GGUF file");
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3)
    return Status::Corruption(c.what(),
                              fmt::format("unsupported version {} (expected 2 or 3)", version_));
  std::uint64_t n_tensors = 0, n_kv = 0;
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  LOCKSTEP_RETURN_IF_ERROR(c.Read(&n_kv, "key/value count"));
  if (n_tensors > kMaxTensors || n_tensors > c.left() / 24)
    return Status::Corruption(c.what(), fmt::format("tensor count {} is absurd for a {} byte "
                                                    "file",
                                                    n_tensors, bytes.size()));
  if (n_kv > kMaxKv || n_kv > c.left() / 12)
    return Status::Corruption(c.what(), fmt::format("key/value count {} is absurd for a {} byte "
                                                    "file",
                                                    n_kv, bytes.size()));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    LOCKSTEP_RETURN_IF_ERROR(c.ReadString(&key, fmt::format("key {}", i)));
    if (key.empty()) return Status::Corruption(c.what(), fmt::format("key {} is empty", i));
    std::uint32_t type = 0;
    LOCKSTEP_RETURN_IF_ERROR(c.Read(&type, "value type of '" + key + "'"));
    GgufValue v;
    LOCKSTEP_RETURN_IF_ERROR(ReadValue(c, type, 0, "key '" + key + "'", &v));
    if (!kv_.emplace(key, std::move(v)).second)
      return Status::Corruption(c.what(), fmt::format("key '{}' appears twice", key));
  }
  std::uint64_t alignment = 32;
  if (auto it = kv_.find("general.alignment"); it != kv_.end()) {
    const auto* a = std::get_if<std::uint64_t>(&it->second.v);
    if (a == nullptr || *a == 0 || (*a & (*a - 1)) != 0 || *a > kMaxAlignment)
      return Status::Corruption(c.what(), "general.alignment is not a power of two up to 65536");
    alignment = *a;
  }
  tensors_.resize(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    LOCKSTEP_RETURN_IF_ERROR(ReadTensorInfo(c, i, &tensors_[static_cast<std::size_t>(i)]));
    if (!by_name_.emplace(tensors_[static_cast<std::size_t>(i)].name, static_cast<std::size_t>(i))
             .second)
      return Status::Corruption(c.what(), fmt::format("tensor '{}' appears twice",
                                                      tensors_[static_cast<std::size_t>(i)].name));
  }
  const std::uint64_t header_end = c.pos();
  const std::uint64_t data_start = (header_end + alignment - 1) / alignment * alignment;
  if (n_tensors > 0 && data_start > bytes.size())
    return Status::Corruption(c.what(), "truncated: the data section is missing");
  const std::uint64_t data_size = data_start <= bytes.size() ? bytes.size() - data_start : 0;
  return PlaceTensors(tensors_, bytes.data() + std::min<std::uint64_t>(data_start, bytes.size()),
                      data_size, alignment, c.what());
}

const GgufTensor* GgufFile::Find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::int64_t> GgufFile::Int(std::string_view key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  if (const auto* u = std::get_if<std::uint64_t>(&it->second.v))
    return *u <= static_cast<std::uint64_t>(INT64_MAX)
               ? std::optional<std::int64_t>(static_cast<std::int64_t>(*u))
               : std::nullopt;
  if (const auto* i = std::get_if<std::int64_t>(&it->second.v)) return *i;
  if (const auto* b = std::get_if<bool>(&it->second.v)) return *b ? 1 : 0;
  return std::nullopt;
}

std::optional<double> GgufFile::Float(std::string_view key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  if (const auto* d = std::get_if<double>(&it->second.v)) return *d;
  if (auto i = Int(key)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::string> GgufFile::String(std::string_view key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(&it->second.v)) return *s;
  return std::nullopt;
}

// ---- writing ----

namespace {

template <class T>
void Put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void PutString(std::string& out, const std::string& s) {
  Put<std::uint64_t>(out, s.size());
  out += s;
}

void PutValue(std::string& out, const GgufValue& v) {
  switch (v.type) {
    case 4:
      Put<std::uint32_t>(out, static_cast<std::uint32_t>(std::get<std::uint64_t>(v.v)));
      return;
    case 5:
      Put<std::int32_t>(out, static_cast<std::int32_t>(std::get<std::int64_t>(v.v)));
      return;
    case 6:
      Put<float>(out, static_cast<float>(std::get<double>(v.v)));
      return;
    case 7:
      Put<std::uint8_t>(out, std::get<bool>(v.v) ? 1 : 0);
      return;
    case 8:
      PutString(out, std::get<std::string>(v.v));
      return;
    case 9: {
      const auto& a = std::get<std::vector<GgufValue>>(v.v);
      Put<std::uint32_t>(out, a.empty() ? 5u : a[0].type);
      Put<std::uint64_t>(out, a.size());
      for (const GgufValue& e : a) PutValue(out, e);
      return;
    }
    default:
      Put<std::uint64_t>(out, std::get<std::uint64_t>(v.v));
      return;
  }
}

}  // namespace

Status WriteGguf(const std::string& path, const std::map<std::string, GgufValue>& kv,
                 const std::vector<GgufTensorToWrite>& tensors) {
  const std::string what = fmt::format("writing GGUF '{}'", path);
  constexpr std::uint64_t kAlign = 32;
  std::string head;
  Put<std::uint32_t>(head, 0x46554747u);
  Put<std::uint32_t>(head, 3);
  Put<std::uint64_t>(head, tensors.size());
  Put<std::uint64_t>(head, kv.size());
  for (const auto& [k, v] : kv) {
    PutString(head, k);
    Put<std::uint32_t>(head, v.type);
    PutValue(head, v);
  }
  std::uint64_t offset = 0;
  for (const GgufTensorToWrite& t : tensors) {
    const TypeInfo* ti = TypeOf(static_cast<std::uint32_t>(t.type));
    std::uint64_t numel = 1;
    for (auto d : t.ne) numel *= d;
    if (ti == nullptr || t.ne.empty() || t.ne[0] % ti->block_elems != 0 ||
        numel / ti->block_elems * ti->block_bytes != t.data.size())
      return Status::InvalidArgument(what, fmt::format("tensor '{}': data size {} does not match "
                                                       "its type and shape",
                                                       t.name, t.data.size()));
    PutString(head, t.name);
    Put<std::uint32_t>(head, static_cast<std::uint32_t>(t.ne.size()));
    for (auto d : t.ne) Put<std::uint64_t>(head, d);
    Put<std::uint32_t>(head, static_cast<std::uint32_t>(t.type));
    Put<std::uint64_t>(head, offset);
    offset += (t.data.size() + kAlign - 1) / kAlign * kAlign;
  }
  head.append((kAlign - head.size() % kAlign) % kAlign, '\0');
  LOCKSTEP_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  LOCKSTEP_RETURN_IF_ERROR(w.Append(std::string_view(head)));
  const std::string pad(kAlign, '\0');
  for (const GgufTensorToWrite& t : tensors) {
    LOCKSTEP_RETURN_IF_ERROR(w.Append(std::span<const std::byte>(t.data)));
    const std::size_t p = (kAlign - t.data.size() % kAlign) % kAlign;
    if (p) LOCKSTEP_RETURN_IF_ERROR(w.Append(std::string_view(pad.data(), p)));
  }
  return w.Commit();
}

}  // namespace lockstep
