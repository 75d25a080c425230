// The isolation wire (see isolated_wire.h) and DumpExportMeta. One list of fields per struct,
// written as a structured binding: the compiler rejects a binding that does not name every
// non-static member, so ExportMeta (or a struct it holds) cannot gain a field that silently stays
// behind in the child.
#include "isolated_wire.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace lockstep {
namespace {

// LOCKSTEP_FIELDS(Type, a, b, c): Tie(x) -> std::tie(x.a, x.b, x.c) (const-preserving) and
// FieldNames(x) -> {"a", "b", "c"}.
#define LOCKSTEP_FIELDS(TYPE, ...)                                           \
  template <class Self_>                                                     \
  requires std::is_same_v<std::remove_const_t<Self_>, TYPE>                  \
  auto Tie(Self_& x) {                                                       \
    auto& [__VA_ARGS__] = x;                                                 \
    return std::tie(__VA_ARGS__);                                            \
  }                                                                          \
  [[maybe_unused]] const std::vector<std::string>& FieldNames(const TYPE&) { \
    static const std::vector<std::string> names = SplitNames(#__VA_ARGS__);  \
    return names;                                                            \
  }

std::vector<std::string> SplitNames(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

LOCKSTEP_FIELDS(StageTiming, wait_ns, compute_ns, cpu_ns, dev_wait_ns, dev_compute_ns, dev_copy_ns,
                init_ns, graph)
LOCKSTEP_FIELDS(WindowRecord, idx, p, T, T_mtp, merged, from_sfx, chain_n, accepted, source, draft,
                emitted, begin_ns, end_ns, draft_ns, verify_ns, wait_ns, compute_ns, commit_ns,
                export_ns, first_call, stages, step, step_rows, step_seqs, step_prefill_rows)
LOCKSTEP_FIELDS(ExportStep, step, begin_ns, end_ns, rows, seqs, verify_rows, prefill_rows,
                queue_depth, live, weight_bytes, flops)
LOCKSTEP_FIELDS(ExportItem, rel, kind, stage, layer, dtype, shape, valid_rows, capacity_rows,
                has_scales, scale_row_elems)
LOCKSTEP_FIELDS(ExportCheckpoint, name, window, point, p, T, committed_rows, spec_rows,
                recurrent_pos, items)
LOCKSTEP_FIELDS(SamplerSummary, n_samples, interval_min_ns, interval_median_ns, interval_max_ns,
                nvml, guard, min_host_available_bytes, max_swap_used_bytes, max_rss_bytes,
                n_device_samples, min_device_free_bytes, max_temperature_c, min_sm_clock_mhz,
                max_sm_clock_mhz, pcie_gen, pcie_width)
LOCKSTEP_FIELDS(ExportOpName, name, inputs, state)
LOCKSTEP_FIELDS(ExportOpRecord, window, stage, layer, op, index, position, row, digest, l2,
                dump_offset, dump_len)
LOCKSTEP_FIELDS(ExportMeta, schema, schema_version, arm, run_id, created_utc, executable_sha256,
                config_sha256, model_sha256, request_sha256, request_id, host, prefix_reuse,
                prompt_tokens_reused, preemptions, seed, config_json, request_tokens, max_new,
                output_tokens, stop_reason, text_sha256, checkpoints, windows, steps, counters,
                sampler, unknowns, injections, op_table, op_records, op_dump, file_bytes)
LOCKSTEP_FIELDS(ExportReader::Impl::ItemLoc, data, scale)
// Loc's element type (mem_type) is a libhdf5 id, meaningless in another process: not sent (the
// receiving side never calls libhdf5). Its binding still names it, so a new field is caught.
template <class Self_>
requires std::is_same_v<std::remove_const_t<Self_>, Loc>
auto Tie(Self_& x) {
  auto& [path, dims, rows, row_bytes, offset, spilled, mem_type] = x;
  (void)mem_type;
  return std::tie(path, dims, rows, row_bytes, offset, spilled);
}

template <class T>
struct IsVector : std::false_type {};
template <class T, class A>
struct IsVector<std::vector<T, A>> : std::true_type {};
template <class T>
struct IsMap : std::false_type {};
template <class K, class V, class C, class A>
struct IsMap<std::map<K, V, C, A>> : std::true_type {};
template <class T>
constexpr bool kScalar = std::is_integral_v<T> || std::is_enum_v<T>;

template <class F, class Tuple, std::size_t... I>
void EachField(F&& f, Tuple&& t, std::index_sequence<I...>) {
  (f(I, std::get<I>(t)), ...);
}
template <class F, class Tuple>
void EachField(F&& f, Tuple&& t) {
  EachField(std::forward<F>(f), t,
            std::make_index_sequence<std::tuple_size_v<std::remove_reference_t<Tuple>>>());
}

class Writer {
 public:
  std::string out;
  void Int(std::int64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(static_cast<std::uint64_t>(v) >> (8 * i));
    out.append(b, 8);
  }
  template <class V>
  void Put(const V& v) {
    if constexpr (std::is_same_v<V, std::string>) {
      Int(static_cast<std::int64_t>(v.size()));
      out += v;
    } else if constexpr (std::is_floating_point_v<V>) {
      Int(std::bit_cast<std::int64_t>(static_cast<double>(v)));
    } else if constexpr (kScalar<V>) {
      Int(static_cast<std::int64_t>(v));
    } else if constexpr (IsVector<V>::value) {
      Int(static_cast<std::int64_t>(v.size()));
      for (const auto& e : v) Put(e);
    } else if constexpr (IsMap<V>::value) {
      Int(static_cast<std::int64_t>(v.size()));
      for (const auto& [k, e] : v) Put(k), Put(e);
    } else {
      EachField([&](std::size_t, const auto& f) { Put(f); }, Tie(v));
    }
  }
};

class Reader {
 public:
  explicit Reader(std::string_view w) : w_(w) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && w_.empty(); }
  std::int64_t Int() {
    if (!ok_ || w_.size() < 8) return Fail();
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<unsigned char>(w_[i])} << (8 * i);
    w_.remove_prefix(8);
    return static_cast<std::int64_t>(v);
  }
  // A count of elements still to come: each takes at least one byte of the message.
  std::size_t Count() {
    const std::int64_t n = Int();
    if (n < 0 || static_cast<std::uint64_t>(n) > w_.size()) return static_cast<std::size_t>(Fail());
    return static_cast<std::size_t>(n);
  }
  template <class V>
  void Get(V& v) {
    if (!ok_) return;
    if constexpr (std::is_same_v<V, std::string>) {
      const std::size_t n = Count();
      if (!ok_) return;
      v.assign(w_.data(), n);
      w_.remove_prefix(n);
    } else if constexpr (std::is_floating_point_v<V>) {
      v = static_cast<V>(std::bit_cast<double>(Int()));
    } else if constexpr (std::is_same_v<V, bool>) {
      const std::int64_t x = Int();
      if (x != 0 && x != 1) Fail();
      v = x == 1;
    } else if constexpr (kScalar<V>) {
      using U = std::conditional_t<std::is_enum_v<V>, std::underlying_type<V>,
                                   std::type_identity<V>>::type;
      const std::int64_t x = Int();
      bool fits = false;
      if constexpr (std::is_unsigned_v<U>)
        fits = x >= 0 && static_cast<std::uint64_t>(x) <= std::numeric_limits<U>::max();
      else
        fits = x >= std::numeric_limits<U>::min() && x <= std::numeric_limits<U>::max();
      if (!fits) Fail();
      v = static_cast<V>(static_cast<U>(x));
    } else if constexpr (IsVector<V>::value) {
      const std::size_t n = Count();
      v.clear();
      for (std::size_t i = 0; i < n && ok_; ++i) Get(v.emplace_back());
    } else if constexpr (IsMap<V>::value) {
      const std::size_t n = Count();
      v.clear();
      for (std::size_t i = 0; i < n && ok_; ++i) {
        typename V::key_type k{};
        Get(k);
        if (v.count(k) != 0) Fail();
        Get(v[k]);
      }
    } else {
      EachField([&](std::size_t, auto& f) { Get(f); }, Tie(v));
    }
  }

 private:
  std::int64_t Fail() {
    ok_ = false;
    w_ = {};
    return 0;
  }
  std::string_view w_;
  bool ok_ = true;
};

constexpr char kMagic[] = "LSI1";

std::string Quote(const std::string& s) {
  std::string q = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char b[5];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      q += b;
    } else {
      q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

class Dumper {
 public:
  std::string out;
  template <class V>
  void Field(const std::string& name, const V& v) {
    if constexpr (std::is_same_v<V, std::string>) {
      out += name + "=" + Quote(v) + "\n";
    } else if constexpr (std::is_floating_point_v<V>) {
      char b[32];
      std::snprintf(b, sizeof(b), "%.17g", static_cast<double>(v));
      out += name + "=" + b + "\n";
    } else if constexpr (kScalar<V>) {
      out += name + "=" + std::to_string(static_cast<long long>(v)) + "\n";
    } else if constexpr (IsVector<V>::value) {
      out += name + ".size=" + std::to_string(v.size()) + "\n";
      for (std::size_t i = 0; i < v.size(); ++i) Field(name + "[" + std::to_string(i) + "]", v[i]);
    } else if constexpr (IsMap<V>::value) {
      out += name + ".size=" + std::to_string(v.size()) + "\n";
      for (const auto& [k, e] : v) Field(name + "[" + Quote(k) + "]", e);
    } else {
      const auto& names = FieldNames(v);
      EachField([&](std::size_t i, const auto& f) { Field(name + "." + names[i], f); }, Tie(v));
    }
  }
};

}  // namespace

std::string EncodeOpenResult(const Status& s, const ExportReader::Impl* impl) {
  Writer w;
  w.out = kMagic;
  w.Int(static_cast<std::int64_t>(s.code()));
  w.Put(s.ok() ? std::string() : s.message());
  if (!s.ok() || impl == nullptr) return w.out;
  w.Put(impl->meta);
  w.Int(static_cast<std::int64_t>(impl->locs.size()));
  for (const auto& [key, il] : impl->locs) w.Put(key), w.Put(il);
  w.Int(impl->n_items);
  w.Int(impl->spill_bytes);
  return w.out;
}

Status DecodeOpenResult(std::string_view wire, const std::string& file, ExportReader::Impl* impl,
                        bool* malformed) {
  *malformed = true;
  const Status garbled = Status::InvalidArgument(
      file,
      "the isolated HDF5 reader sent a malformed result: the file is damaged or not a "
      "lockstep export");
  if (wire.substr(0, 4) != kMagic) return garbled;
  Reader r(wire.substr(4));
  const std::int64_t code = r.Int();
  std::string message;
  r.Get(message);
  if (!r.ok() || code < 0 || code > static_cast<std::int64_t>(Status::Code::kGateFailed))
    return garbled;
  if (code != 0) {
    if (!r.done()) return garbled;
    *malformed = false;
    return Status::FromCode(static_cast<Status::Code>(code), message);
  }
  r.Get(impl->meta);
  const std::size_t n = r.Count();
  for (std::size_t i = 0; i < n && r.ok(); ++i) {
    std::string key;
    r.Get(key);
    ExportReader::Impl::ItemLoc il;
    r.Get(il);
    if (r.ok() && !impl->locs.emplace(std::move(key), std::move(il)).second) return garbled;
  }
  impl->n_items = r.Int();
  impl->spill_bytes = r.Int();
  if (!r.done()) return garbled;
  *malformed = false;
  return Status::Ok();
}

std::string DumpExportMeta(const ExportMeta& m) {
  Dumper d;
  d.Field("meta", m);
  return d.out;
}

}  // namespace lockstep
