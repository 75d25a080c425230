// ExportReader (see export_reader.h): Open, the root, request, counters, trace and sampler tables,
// and row reads. The items (/checkpoints, /index/items) are export_index.cpp's; the bounded HDF5
// readers h5_bounded.cpp's.
#include "lockstep/compare/export_reader.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <utility>

#include "export_index.h"
#include "export_ops.h"
#include "h5_bounded.h"
#include "lockstep/h5/handle.h"
#include "lockstep/h5/rows.h"

namespace lockstep {
namespace {

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

// /injections (absent: the run had none): one JSON object per --inject (SCHEMA.md).
Status ReadInjections(hid_t f, std::int64_t max_bytes, std::vector<std::string>* out) {
  return ReadStringList(f, "injections", max_bytes, out);
}

}  // namespace

std::int64_t ExportItem::row_elems() const {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::size_t ExportItem::elem_bytes() const { return dtype_size(dtype); }

Status ExportReader::Impl::Read(const Loc& loc, std::int64_t row0, std::int64_t n,
                                void* dst) const {
  if (row0 < 0 || n < 0 || row0 > loc.rows || n > loc.rows - row0)
    return Status::InvalidArgument(
        loc.path, "rows [" + std::to_string(row0) + ", +" + std::to_string(n) +
                      ") are outside the dataset's " + std::to_string(loc.rows) + " rows");
  if (n == 0) return Status::Ok();
  if (dst == nullptr) return Status::InvalidArgument(loc.path, "null destination");
  if (loc.offset >= 0) {
    const int from = loc.spilled ? spill_fd : fd;
    auto* p = static_cast<char*>(dst);
    auto left = static_cast<std::size_t>(n * loc.row_bytes);
    auto off = static_cast<off_t>(loc.offset + row0 * loc.row_bytes);
    while (left > 0) {
      const ssize_t r = ::pread(from, p, left, off);
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

// /trace/stages into meta.windows[w].stages. Rows come in (window, stage) order, each window's
// stages numbered from 0 without gaps; anything else is a damaged file, never silently reordered.
Status ExportReader::Impl::ReadStages() {
  const hid_t f = file.get();
  const std::string path = "/trace/stages";
  if (H5Lexists(f, path.c_str(), H5P_DEFAULT) <= 0)
    return Status::Ok();  // written before stages were
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
  const auto n_windows = static_cast<std::int64_t>(meta.windows.size());
  LOCKSTEP_ASSIGN_OR_RETURN(auto rows, ReadTable(ds.get(), path, kTraceStageFields, limits,
                                                 n_windows * kMaxStagesPerWindow, meta.file_bytes));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const std::string at = path + " row " + std::to_string(i);
    if (r[0] < 0 || r[0] >= n_windows)
      return Bad(at, "window " + std::to_string(r[0]) + " is not one of the " +
                         std::to_string(n_windows) + " windows of /trace/windows");
    WindowRecord& w = meta.windows[static_cast<std::size_t>(r[0])];
    const bool next_window = i == 0 || r[0] > rows[i - 1][0];
    if ((!next_window && r[0] != rows[i - 1][0]) ||
        r[1] != static_cast<std::int64_t>(w.stages.size()))
      return Bad(at, "out of order (window " + std::to_string(r[0]) + ", stage " +
                         std::to_string(r[1]) + "; rows go by window, then stage from 0)");
    for (std::size_t k = 2; k <= 4; ++k)
      if (r[k] < 0) return Bad(at, std::string("negative ") + kTraceStageFields[k].name);
    for (std::size_t k = 5; k <= 8; ++k)
      if (r[k] < -1)
        return Bad(at,
                   std::string(kTraceStageFields[k].name) + " below -1 (the only unknown value)");
    if (r[9] < 0 || r[9] > 3)
      return Bad(at, "graph " + std::to_string(r[9]) + " (0 none, 1 eager, 2 capture, 3 replay)");
    StageTiming st;
    st.wait_ns = r[2], st.compute_ns = r[3], st.cpu_ns = r[4];
    st.dev_wait_ns = r[5], st.dev_compute_ns = r[6], st.dev_copy_ns = r[7], st.init_ns = r[8];
    st.graph = static_cast<GraphUse>(r[9] - 1);
    w.stages.push_back(st);
  }
  return Status::Ok();
}

// /trace/steps into meta.steps and /trace/window_steps into each window's step fields. Both are
// optional and come together (written when the request ran in engine steps, SCHEMA.md): steps in
// strictly ascending order with non-negative counts that fit an int; one map row per window, in
// window order, each naming a step of /trace/steps or -1 (unknown).
Status ExportReader::Impl::ReadSteps() {
  const hid_t f = file.get();
  const std::string path = "/trace/steps", map_path = "/trace/window_steps";
  const bool has_steps = H5Lexists(f, path.c_str(), H5P_DEFAULT) > 0;
  const bool has_map = H5Lexists(f, map_path.c_str(), H5P_DEFAULT) > 0;
  if (!has_steps && !has_map) return Status::Ok();  // no engine steps recorded (or older file)
  if (!has_steps || !has_map)
    return Bad(has_steps ? map_path : path,
               "missing: written together with " + (has_steps ? path : map_path));
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
  LOCKSTEP_ASSIGN_OR_RETURN(auto rows, ReadTable(ds.get(), path, kTraceStepFields, limits,
                                                 limits.max_windows, meta.file_bytes));
  std::map<std::int64_t, std::size_t> by_step;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const std::string at = path + " row " + std::to_string(i);
    if (r[0] < 0 || (i > 0 && r[0] <= rows[i - 1][0]))
      return Bad(at, "step " + std::to_string(r[0]) + " out of order (steps ascend from 0 up)");
    for (std::size_t k = 3; k < kTraceStepFields.size(); ++k)
      if (r[k] < 0 || (k <= 8 && r[k] > INT_MAX))
        return Bad(at, std::string(kTraceStepFields[k].name) + " " + std::to_string(r[k]) +
                           " out of range");
    auto c = [&](std::size_t k) { return static_cast<int>(r[k]); };
    meta.steps.push_back({r[0], r[1], r[2], c(3), c(4), c(5), c(6), c(7), c(8), r[9], r[10]});
    by_step[r[0]] = i;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle mds, OpenObject(f, map_path, H5I_DATASET));
  LOCKSTEP_ASSIGN_OR_RETURN(auto map, ReadTable(mds.get(), map_path, kTraceWindowStepFields, limits,
                                                limits.max_windows, meta.file_bytes));
  if (map.size() != meta.windows.size())
    return Bad(map_path, std::to_string(map.size()) + " rows for " +
                             std::to_string(meta.windows.size()) + " windows (one per window)");
  for (std::size_t i = 0; i < map.size(); ++i) {
    const std::string at = map_path + " row " + std::to_string(i);
    WindowRecord& w = meta.windows[i];
    if (map[i][0] != w.idx)
      return Bad(at, "window " + std::to_string(map[i][0]) + ", expected " + std::to_string(w.idx));
    if (map[i][1] == -1) continue;  // unknown: step -1, counts 0
    auto it = by_step.find(map[i][1]);
    if (it == by_step.end())
      return Bad(at, "step " + std::to_string(map[i][1]) + " is not a row of " + path);
    const ExportStep& st = meta.steps[it->second];
    w.step = st.step;
    w.step_rows = st.rows, w.step_seqs = st.seqs, w.step_prefill_rows = st.prefill_rows;
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

Status ExportReader::Impl::ReadAll() {
  LOCKSTEP_RETURN_IF_ERROR(ReadRoot());
  LOCKSTEP_RETURN_IF_ERROR(ReadRequestAndOutput());
  LOCKSTEP_RETURN_IF_ERROR(ReadCounters());
  LOCKSTEP_RETURN_IF_ERROR(ReadWindows());
  LOCKSTEP_RETURN_IF_ERROR(ReadStages());
  LOCKSTEP_RETURN_IF_ERROR(ReadSteps());
  LOCKSTEP_RETURN_IF_ERROR(ReadOps(file.get(), limits, &meta));
  LOCKSTEP_RETURN_IF_ERROR(ReadSampler());
  return ReadCheckpoints();
}

// The root's identity and attributes, and /config.
Status ExportReader::Impl::ReadRoot() {
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
  if (H5Aexists(root.get(), "request_id") > 0) {  // optional: one-request runs, older files
    LOCKSTEP_ASSIGN_OR_RETURN(meta.request_id, StrAttr(root.get(), "/", "request_id", max_str));
  }
  if (H5Aexists(root.get(), "host") > 0) {  // optional: older files
    LOCKSTEP_ASSIGN_OR_RETURN(meta.host, StrAttr(root.get(), "/", "host", max_str));
  }
  if (H5Aexists(root.get(), "prefix_reuse") > 0) {  // optional: served requests, older files
    LOCKSTEP_ASSIGN_OR_RETURN(meta.prefix_reuse, StrAttr(root.get(), "/", "prefix_reuse", max_str));
    LOCKSTEP_ASSIGN_OR_RETURN(meta.prompt_tokens_reused,
                              IntAttr(root.get(), "/", "prompt_tokens_reused"));
  }
  if (H5Aexists(root.get(), "preemptions") > 0) {  // optional: preempted served requests
    LOCKSTEP_ASSIGN_OR_RETURN(meta.preemptions, StrAttr(root.get(), "/", "preemptions", max_str));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(meta.seed, IntAttr(root.get(), "/", "seed"));
  if (meta.executable_sha256.empty())
    meta.unknowns.push_back("executable_sha256: empty (the binary was unreadable)");
  {
    LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, "/config", H5I_DATASET));
    LOCKSTEP_ASSIGN_OR_RETURN(meta.config_json, ReadString(ds.get(), false, "/config", max_str));
  }
  return Status::Ok();
}

// Token ids: integers of at most 4 bytes, read as int32.
Status ExportReader::Impl::ReadTokens(const std::string& path, std::vector<std::int32_t>* out) {
  const hid_t f = file.get();
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, OpenObject(f, path, H5I_DATASET));
  H5Handle ft(H5Dget_type(ds.get()));
  if (!ft.valid() || H5Tget_class(ft.get()) != H5T_INTEGER || H5Tget_size(ft.get()) > 4)
    return Bad(path, "holds " + (ft.valid() ? DescribeType(ft.get()) : std::string("?")) +
                         ", expected int32 token ids");
  LOCKSTEP_ASSIGN_OR_RETURN(auto shape, Shape(ds.get(), path, limits));
  if (shape.size() != 1) return Bad(path, "expected one dimension, got shape " + ShapeText(shape));
  if (shape[0] > limits.max_tokens || BytesWithin(shape, 4, meta.file_bytes) < 0)
    return Bad(path, std::to_string(shape[0]) + " token ids exceed the limit of " +
                         std::to_string(limits.max_tokens) + " or the file's size");
  out->resize(static_cast<std::size_t>(shape[0]));
  if (!out->empty() &&
      H5Dread(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) < 0)
    return Bad(path, "token ids unreadable (corrupt file?)");
  return Status::Ok();
}

Status ExportReader::Impl::ReadRequestAndOutput() {
  const hid_t f = file.get();
  const std::int64_t max_str = std::min(limits.max_string_bytes, meta.file_bytes);
  LOCKSTEP_RETURN_IF_ERROR(ReadTokens("/request/tokens", &meta.request_tokens));
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle req, OpenObject(f, "/request", H5I_GROUP));
  LOCKSTEP_ASSIGN_OR_RETURN(meta.max_new, IntAttr(req.get(), "/request", "max_new"));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t req_seed, IntAttr(req.get(), "/request", "seed"));
  if (req_seed != meta.seed)
    return Bad("/request", "seed attribute " + std::to_string(req_seed) +
                               " differs from the root's " + std::to_string(meta.seed));
  LOCKSTEP_RETURN_IF_ERROR(ReadTokens("/output/tokens", &meta.output_tokens));
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle out, OpenObject(f, "/output", H5I_GROUP));
  LOCKSTEP_ASSIGN_OR_RETURN(meta.stop_reason,
                            StrAttr(out.get(), "/output", "stop_reason", max_str));
  LOCKSTEP_ASSIGN_OR_RETURN(meta.text_sha256,
                            StrAttr(out.get(), "/output", "text_sha256", max_str));
  LOCKSTEP_RETURN_IF_ERROR(ReadInjections(f, max_str, &meta.injections));

  return Status::Ok();
}

// /counters/stage{S}: the required attributes and any others, all integers.
Status ExportReader::Impl::ReadCounters() {
  const hid_t f = file.get();
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle counters, OpenObject(f, "/counters", H5I_GROUP));
  LOCKSTEP_ASSIGN_OR_RETURN(auto stages, Children(counters.get(), "/counters", limits.max_items));
  for (const Link& st : stages) {
    const std::string path = "/counters/" + st.name;
    if (ParseIndex(st.name, "stage") < 0) return Bad(path, "unexpected entry (expected stage{S})");
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

  return Status::Ok();
}

// /trace/windows into meta.windows, each column the WindowRecord field of its name.
Status ExportReader::Impl::ReadWindows() {
  const hid_t f = file.get();
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

  return Status::Ok();
}

// /checkpoints exists only when some window exported state (--export-windows none: trace only).
Status ExportReader::Impl::ReadCheckpoints() {
  const hid_t f = file.get();
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
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, limits.isolate
                                                            ? OpenIsolated(path, limits)
                                                            : OpenInProcess(path, limits));
  return std::unique_ptr<ExportReader>(new ExportReader(std::move(impl)));
}

Status OpenExportFile(const std::string& path, ExportReader::Impl& impl, struct stat* st) {
  impl.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl.fd < 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) return Status::NotFound(path, "no such file");
    return Status::IOError(path, std::string("cannot open for reading: ") + std::strerror(e));
  }
  if (::fstat(impl.fd, st) != 0)
    return Status::IOError(path, std::string("fstat failed: ") + std::strerror(errno));
  if (!S_ISREG(st->st_mode)) return Status::InvalidArgument(path, "not a regular file");
  ssize_t got = 0;
  const bool hdf5 = HasHdf5Signature(impl.fd, &got);
  if (got < 0) return Status::IOError(path, std::string("read failed: ") + std::strerror(errno));
  if (!hdf5)
    return Status::InvalidArgument(path, st->st_size == 0
                                             ? "empty file, not an HDF5 export"
                                             : "not an HDF5 file (no HDF5 signature at offset 0)");
  return Status::Ok();
}

Result<std::unique_ptr<ExportReader::Impl>> OpenInProcess(const std::string& path,
                                                          const ReaderLimits& limits,
                                                          bool close_hdf5) {
  using Impl = ExportReader::Impl;
  H5Eset_auto2(H5E_DEFAULT, nullptr,
               nullptr);  // errors become Status, not stderr noise (per thread)
  auto impl = std::make_unique<Impl>();
  impl->limits = limits;
  impl->file_path = path;
  struct stat st;
  LOCKSTEP_RETURN_IF_ERROR(OpenExportFile(path, *impl, &st));
  impl->meta.file_bytes = static_cast<std::int64_t>(st.st_size);
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
  impl->file =
      H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.valid() ? fapl.get() : H5P_DEFAULT));
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
  if (!impl->needs_fallback && close_hdf5)
    impl->file.reset();  // every read goes through pread(): free HDF5's state
  return impl;
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
  return loc != nullptr && loc->data.offset >= 0 && !loc->data.spilled;
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
