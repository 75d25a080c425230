#include "lockstep/instrument/export_writer.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "export_h5.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/engine.h"
#include "lockstep/h5/handle.h"
#include "lockstep/h5/paths.h"
#include "lockstep/h5/rows.h"

namespace lockstep {

// ---- selections ----

// ---- HDF5 helpers (writer thread only) ----

struct H5Exporter::File {
  H5Handle file;
  H5Handle lcpl;                // link creation: intermediate groups on
  bool lz4 = false;             // chunked + LZ4 datasets (ExportOptions::compress)
  std::vector<IndexRow> index;  // appended by the writer thread as items are written
  int fd = -1;                  // the sec2 driver's descriptor (-1: unknown; no early writeback)
  off_t writeback_to = 0;       // bytes before this offset were handed to the kernel's writeback
};

namespace {

std::string SysError() {
  return errno ? std::string(" (") + std::strerror(errno) + ")" : std::string();
}

// Rolling writeback: once 8 MiB more have reached the page cache, ask the kernel to start writing
// them to the device now (SYNC_FILE_RANGE_WRITE starts the I/O and does not wait for it), so the
// fsync in Finish has only the tail left instead of the whole file. Measured on the 256 MiB export
// benchmark (export_bench, two runs each): 0.85-0.88x a raw write()+fsync without, 1.07-1.08x
// with. Errors are not lost: a failed write-out is reported by that fsync.
void StartWriteback(int fd, off_t& writeback_to) {
#ifdef __linux__
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size - writeback_to < (off_t{8} << 20)) return;
  ::sync_file_range(fd, writeback_to, st.st_size - writeback_to, SYNC_FILE_RANGE_WRITE);
  writeback_to = st.st_size;
#else
  (void)fd;
  (void)writeback_to;
#endif
}

// HDF5's filter pipeline (--export-compress) allocates and frees a chunk-sized buffer or two for
// every chunk. glibc hands such blocks back to the kernel (mmap'd blocks at free; the heap top
// above the trim threshold), so every chunk faults its pages in again: measured 47,000 minor
// faults per 256 MiB of LZ4 export, and 0.20x of a raw write instead of 0.86x. The exporting
// process therefore keeps blocks under 4 MiB in the heap and up to 64 MiB of free heap top.
// Process-wide and once; left alone when the user configures malloc through GLIBC_TUNABLES.
void KeepFreedMemory() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] {
    const char* t = std::getenv("GLIBC_TUNABLES");
    if (t && std::strstr(t, "glibc.malloc.")) return;
    ::mallopt(M_MMAP_THRESHOLD, 4 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 64 << 20);
  });
#endif
}

}  // namespace

Status H5Fail(const std::string& what) {
  return Status::IOError("export", "HDF5 failed writing '" + what + "'" + SysError());
}

// A one-dimensional dataset of n records of type t from `rows`, open for its attributes.
Result<H5Handle> WriteRecords(hid_t file, hid_t lcpl, const char* path, hid_t t, const void* rows,
                              std::size_t n) {
  const hsize_t dims = n;
  H5Handle sp(H5Screate_simple(1, &dims, nullptr));
  H5Handle ds(H5Dcreate2(file, path, t, sp.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
  if (!ds.valid() || (n > 0 && H5Dwrite(ds.get(), t, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) < 0))
    return H5Fail(path);
  return ds;
}

namespace {

hid_t FileType(DType t) {
  switch (t) {
    case DType::kF32:
      return H5T_IEEE_F32LE;
    case DType::kBF16:
      return H5T_STD_U16LE;  // raw bf16 bits; attribute dtype = "bf16"
    case DType::kI8:
      return H5T_STD_I8LE;
    default:
      return H5T_STD_U8LE;
  }
}
hid_t MemType(DType t) {
  switch (t) {
    case DType::kF32:
      return H5T_NATIVE_FLOAT;
    case DType::kBF16:
      return H5T_NATIVE_UINT16;
    case DType::kI8:
      return H5T_NATIVE_INT8;
    default:
      return H5T_NATIVE_UINT8;
  }
}

bool AttrInt(hid_t obj, const char* name, std::int64_t v) {
  H5Handle sp(H5Screate(H5S_SCALAR));
  H5Handle a(H5Acreate2(obj, name, H5T_STD_I64LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  return a.valid() && H5Awrite(a.get(), H5T_NATIVE_INT64, &v) >= 0;
}

bool AttrStr(hid_t obj, const char* name, const std::string& v) {
  H5Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), v.empty() ? 1 : v.size());
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  H5Handle sp(H5Screate(H5S_SCALAR));
  H5Handle a(H5Acreate2(obj, name, t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char zero = 0;
  return a.valid() && H5Awrite(a.get(), t.get(), v.empty() ? &zero : v.data()) >= 0;
}

// Creates dataset `path` (intermediate groups included) and writes `data` in one call. With
// `lz4`, non-empty datasets are chunked by whole rows (about 1 MiB per chunk, the rows the engine
// appends) and compressed; written whole in one call, so HDF5's chunk cache never re-reads a chunk.
Result<H5Handle> WriteDataset(hid_t file, hid_t lcpl, const std::string& path, DType dtype,
                              const std::vector<hsize_t>& dims, const void* data,
                              bool lz4 = false) {
  H5Handle sp(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  if (!sp.valid()) return H5Fail(path);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  hsize_t elems = 1;
  for (auto d : dims) elems *= d;
  if (lz4 && elems > 0 && !dims.empty()) {
    std::vector<hsize_t> chunk = dims;
    const hsize_t row_bytes = elems / dims[0] * dtype_size(dtype);
    chunk[0] = std::max<hsize_t>(
        1, std::min<hsize_t>(dims[0], (hsize_t{1} << 20) / std::max<hsize_t>(1, row_bytes)));
    const unsigned cd[1] = {0};  // 0: the plugin's default block size
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0 ||
        H5Pset_filter(dcpl.get(), kH5FilterLz4, H5Z_FLAG_MANDATORY, 1, cd) < 0)
      return H5Fail(path + " (LZ4 chunking)");
  }
  H5Handle ds(
      H5Dcreate2(file, path.c_str(), FileType(dtype), sp.get(), lcpl, dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) return H5Fail(path);
  if (elems == 0) return ds;
  // Uncompressed datasets over 1 MiB go out in pieces of whole rows of at most 1 MiB: a single
  // multi-MiB write() into the page cache now and then stalls for 0.3-0.7 s on this ext4/kernel
  // (measured: 4 MiB calls stalled about once in ten 256 MiB files, 1-2 MiB calls never), and
  // the export's throughput with it. (Chunked datasets are written chunk by chunk anyway.)
  const hsize_t row_elems = dims.empty() ? 1 : elems / std::max<hsize_t>(1, dims[0]);
  const hsize_t row_bytes = row_elems * dtype_size(dtype);
  const hsize_t piece_rows =
      std::max<hsize_t>(1, (hsize_t{1} << 20) / std::max<hsize_t>(1, row_bytes));
  if (lz4 || dims.empty() || dims[0] <= piece_rows) {
    if (H5Dwrite(ds.get(), MemType(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
      return H5Fail(path);
    return ds;
  }
  H5Handle file_space(H5Dget_space(ds.get()));
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  for (hsize_t r = 0; r < dims[0]; r += piece_rows) {
    start[0] = r;
    count[0] = std::min(piece_rows, dims[0] - r);
    H5Handle mem_space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
    if (!file_space.valid() || !mem_space.valid() ||
        H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                            nullptr) < 0 ||
        H5Dwrite(ds.get(), MemType(dtype), mem_space.get(), file_space.get(), H5P_DEFAULT,
                 static_cast<const std::byte*>(data) + r * row_bytes) < 0)
      return H5Fail(path);
  }
  return ds;
}

}  // namespace

// ---- lifecycle ----

H5Exporter::H5Exporter(const ExportOptions& opts)
    : opts_(opts),
      partial_(opts.path + ".partial"),
      quota_(opts.max_bytes, opts.max_windows, opts.windows, static_cast<int>(opts.points.size())) {
}

Result<std::unique_ptr<H5Exporter>> H5Exporter::Create(const ExportOptions& opts) {
  // A write past RLIMIT_FSIZE must fail with EFBIG, not kill the process: the run keeps its output.
  std::signal(SIGXFSZ, SIG_IGN);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become Status, not stderr noise
  if (!opts.compress.empty() && opts.compress != "lz4")
    return Status::InvalidArgument("--export-compress",
                                   "expected none or lz4, got '" + opts.compress + "'");
  if (opts.compress == "lz4" && H5Zfilter_avail(kH5FilterLz4) <= 0)
    return Status::NotSupported(
        "--export-compress lz4",
        "the LZ4 HDF5 filter plugin is not available (Debian: apt install hdf5-filter-plugin; "
        "or set HDF5_PLUGIN_PATH)");
  LOCKSTEP_RETURN_IF_ERROR(CheckOutputFolder(opts.path, "--export"));
  KeepFreedMemory();
  std::unique_ptr<H5Exporter> e(new H5Exporter(opts));
  e->file_ = std::make_unique<File>();
  e->file_->lz4 = opts.compress == "lz4";
  errno = 0;
  // Page-aligned large datasets: datasets of 64 KiB and more start on a 4 KiB boundary, so
  // their writes go to the page cache whole. (The latest-format metadata option was tried and
  // dropped: HDF5 1.10 crashed on a failing write with it.)
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_alignment(fapl.get(), 64 * 1024, 4096);
  e->file_->file = H5Handle(H5Fcreate(e->partial_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!e->file_->file.valid())
    return Status::IOError("--export '" + opts.path + "'",
                           "cannot create '" + e->partial_ + "'" + SysError());
  void* vfd = nullptr;  // default (sec2) driver: the handle is the POSIX descriptor
  if (H5Fget_vfd_handle(e->file_->file.get(), fapl.get(), &vfd) >= 0 && vfd)
    e->file_->fd = *static_cast<int*>(vfd);
  e->file_->lcpl = H5Handle(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(e->file_->lcpl.get(), 1);
  e->writer_ = std::thread([p = e.get()] { p->WriterLoop(); });
  return e;
}

H5Exporter::~H5Exporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (file_) {
    file_->lcpl.reset();
    file_->file.reset();  // an unfinished export stays as .partial
  }
}

void H5Exporter::Enqueue(Job job, std::size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  // Bounded: wait while the queue holds more than the budget (one oversized job may pass alone).
  cv_.wait(lock, [&] {
    return queued_bytes_ == 0 || queued_bytes_ + bytes <= opts_.max_queue_bytes || stop_;
  });
  queued_bytes_ += bytes;
  queue_.emplace_back(std::move(job), bytes);
  cv_.notify_all();
}

void H5Exporter::WriterLoop() {
  H5Eset_auto2(H5E_DEFAULT, nullptr,
               nullptr);  // per-thread in thread-safe builds: silence here too
  for (;;) {
    std::pair<Job, std::size_t> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    bool skip;
    {
      std::lock_guard<std::mutex> lock(mu_);
      skip = !error_.ok();
    }
    Status s = skip ? Status::Ok() : item.first();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      queued_bytes_ -= item.second;
      busy_ = false;
    }
    cv_.notify_all();
  }
}

Status H5Exporter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  return error_;
}

// ---- observer ----

bool H5Exporter::WantsCheckpoint(int window, CheckpointPoint point) const {
  return !quota_.over() && opts_.windows.Contains(window) && opts_.points.count(point) > 0;
}

void H5Exporter::OnCheckpointBegin(const CheckpointInfo& info) {
  items_in_checkpoint_ = 0;
  File* f = file_.get();
  Enqueue(
      [f, info] {
        const std::string name = CheckpointGroupName(info.window, info.point);
        H5Handle g(
            H5Gcreate2(f->file.get(), name.c_str(), f->lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
        if (!g.valid()) return H5Fail(name);
        bool ok = AttrInt(g.get(), "window", info.window) && AttrInt(g.get(), "p", info.p) &&
                  AttrInt(g.get(), "T", info.T) &&
                  AttrInt(g.get(), "committed_rows", info.committed_rows) &&
                  AttrInt(g.get(), "spec_rows", info.spec_rows) &&
                  AttrInt(g.get(), "recurrent_pos", info.recurrent_pos) &&
                  AttrStr(g.get(), "point", CheckpointPointName(info.point));
        return ok ? Status::Ok() : H5Fail(name + " attributes");
      },
      64);
}

H5Exporter::Buffer H5Exporter::TakeBuffer(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < pool_.size(); ++i)
      if (pool_[i].capacity >= bytes) {
        Buffer b = std::move(pool_[i]);
        pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
  }
  Buffer b;
  b.capacity = bytes;
#ifdef MADV_HUGEPAGE
  // Buffers of 2 MiB and more are their own mappings, advised for transparent huge pages: the
  // first touch then faults once per 2 MiB instead of once per 4 KiB. Each arm is a fresh process
  // with a fresh exporter, so its first queue-full of buffers is always first-touch memory;
  // measured on the 256 MiB export benchmark: ~30,000 page faults and 3-4x the export time.
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  if (bytes >= kHuge) {
    const std::size_t len = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      ::madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP this is an ordinary mapping
      b.data = std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p),
                                            [len](std::byte* q) { ::munmap(q, len); });
      return b;
    }
  }
#endif
  b.data = std::shared_ptr<std::byte[]>(
      new std::byte[bytes == 0 ? 1 : bytes]);  // default-init: no zeroing
  return b;
}

void H5Exporter::ReturnBuffer(Buffer buf) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pool_.size() < 64) pool_.push_back(std::move(buf));
}

void H5Exporter::OnState(const CheckpointInfo& info, const StateView& v) {
  // Copy now (the view points into live engine memory); the writer thread does the I/O.
  const std::size_t n_bytes = static_cast<std::size_t>(v.rows) * v.row_bytes;
  if (!quota_.Take(n_bytes, info.window)) return;  // over the budget: abandoned at Finish
  Buffer data = TakeBuffer(n_bytes);
  for (int r = 0; r < v.rows; ++r)
    std::memcpy(data.data.get() + static_cast<std::size_t>(r) * v.row_bytes, v.row(r), v.row_bytes);
  std::vector<float> scales;
  int heads = 0;
  if (v.scales && v.shape.size() >= 2) {
    heads = static_cast<int>(v.shape[1]);
    scales.resize(static_cast<std::size_t>(v.rows) * static_cast<std::size_t>(heads));
    for (int r = 0; r < v.rows; ++r)
      std::memcpy(scales.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(heads),
                  v.scales(r), static_cast<std::size_t>(heads) * sizeof(float));
  }
  ++items_in_checkpoint_;
  const std::size_t bytes = n_bytes + scales.size() * sizeof(float);
  File* f = file_.get();
  StateView meta = v;
  meta.row = nullptr;
  meta.scales = nullptr;
  Enqueue(
      [this, f, info, meta, d = std::move(data), sc = std::move(scales),
       heads]() mutable -> Status {
        const std::string path =
            ItemPath(info.window, info.point, meta.stage, meta.layer, meta.kind);
        std::vector<hsize_t> dims;
        for (auto x : meta.shape) dims.push_back(static_cast<hsize_t>(x));
        auto written = WriteDataset(f->file.get(), f->lcpl.get(), path, meta.dtype, dims,
                                    d.data.get(), f->lz4);
        ReturnBuffer(std::move(d));
        LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, std::move(written));
        bool ok = AttrStr(ds.get(), "kind", ItemKindName(meta.kind)) &&
                  AttrInt(ds.get(), "stage", meta.stage) &&
                  AttrInt(ds.get(), "layer", meta.layer) &&
                  AttrInt(ds.get(), "valid_rows", meta.rows) &&
                  AttrInt(ds.get(), "capacity_rows", meta.rows_capacity) &&
                  AttrStr(ds.get(), "dtype", std::string(dtype_name(meta.dtype)));
        if (!ok) return H5Fail(path + " attributes");
        IndexRow row{};
        const std::string cp = CheckpointName(info.window, info.point);
        const std::string rel = ItemRel(meta.stage, meta.layer, meta.kind);
        std::snprintf(row.checkpoint, sizeof(row.checkpoint), "%s", cp.c_str());
        std::snprintf(row.rel, sizeof(row.rel), "%s", rel.c_str());
        std::snprintf(row.kind, sizeof(row.kind), "%s", ItemKindName(meta.kind));
        std::snprintf(row.dtype, sizeof(row.dtype), "%s",
                      std::string(dtype_name(meta.dtype)).c_str());
        row.stage = meta.stage;
        row.layer = meta.layer;
        row.rank = static_cast<std::int32_t>(std::min<std::size_t>(dims.size(), 4));
        for (std::size_t i = 0; i < 4; ++i)
          row.dims[i] = i < dims.size() ? static_cast<std::int64_t>(dims[i]) : 0;
        row.valid_rows = meta.rows;
        row.capacity_rows = meta.rows_capacity;
        const haddr_t off = H5Dget_offset(ds.get());
        row.offset = off == HADDR_UNDEF ? -1 : static_cast<std::int64_t>(off);
        row.scale_offset = -1;
        if (!sc.empty() || (meta.dtype == DType::kI8 && heads > 0)) {
          std::vector<hsize_t> sdims{static_cast<hsize_t>(meta.rows), static_cast<hsize_t>(heads)};
          LOCKSTEP_ASSIGN_OR_RETURN(
              H5Handle sds, WriteDataset(f->file.get(), f->lcpl.get(), path + "_scale", DType::kF32,
                                         sdims, sc.data(), f->lz4));
          const haddr_t soff = H5Dget_offset(sds.get());
          row.scale_offset = soff == HADDR_UNDEF ? -1 : static_cast<std::int64_t>(soff);
          row.scale_dims[0] = meta.rows;
          row.scale_dims[1] = heads;
        }
        if (dims.size() <= 4) f->index.push_back(row);  // a rank above 4 is left to the full walk
        StartWriteback(f->fd, f->writeback_to);
        return Status::Ok();
      },
      bytes);
}

void H5Exporter::OnCheckpointEnd(const CheckpointInfo& info) {
  counts_[info.point].push_back(items_in_checkpoint_);
  quota_.EndCheckpoint(info.window);
}

void H5Exporter::OnWindow(const WindowRecord& rec) { windows_.push_back(rec); }

void H5Exporter::OnStep(const StepRecord& step) { steps_.push_back(step); }

bool H5Exporter::WantsOps(int window) const { return opts_.op_digests.Contains(window); }

void H5Exporter::OnOp(const OpRecord& rec) {
  bool dump = false;
  for (const OpDump& d : opts_.op_dumps) dump = dump || d.Wants(rec.def->name, rec.window);
  ops_.Add(rec, dump);
}

// ---- finish ----

namespace {

Status WriteStageTrace(hid_t file, hid_t lcpl, const std::vector<WindowRecord>& ws) {
  H5Handle t = RowType(sizeof(TraceStageRow), kTraceStageFields);
  if (!t.valid()) return H5Fail("trace/stages type");
  std::vector<TraceStageRow> rows;
  for (const auto& w : ws)
    for (std::size_t s = 0; s < w.stages.size(); ++s) {
      const StageTiming& st = w.stages[s];
      TraceStageRow r{};
      r.window = w.idx, r.stage = static_cast<std::int32_t>(s);
      r.wait_ns = st.wait_ns, r.compute_ns = st.compute_ns, r.cpu_ns = st.cpu_ns;
      // Any negative device value is "not measured": -1, as the reader expects.
      auto dev = [](std::int64_t v) { return v >= 0 ? v : std::int64_t{-1}; };
      r.dev_wait_ns = dev(st.dev_wait_ns), r.dev_compute_ns = dev(st.dev_compute_ns);
      r.dev_copy_ns = dev(st.dev_copy_ns), r.init_ns = dev(st.init_ns);
      r.graph = static_cast<std::uint8_t>(static_cast<int>(st.graph) +
                                          1);  // GraphUse kNone (-1) .. kReplay (2)
      rows.push_back(r);
    }
  LOCKSTEP_ASSIGN_OR_RETURN(
      H5Handle ds, WriteRecords(file, lcpl, "trace/stages", t.get(), rows.data(), rows.size()));
  if (!AttrStr(ds.get(), "clock",
               "ns; wait/compute/cpu: host (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID); dev_*: CUDA "
               "events on the "
               "stage's stream; init: host set-up; -1 = not measured (cpu backend); graph: 0 none, "
               "1 eager, "
               "2 capture, 3 replay"))
    return H5Fail("trace/stages attributes");
  return Status::Ok();
}

Status WriteTrace(hid_t file, hid_t lcpl, const std::vector<WindowRecord>& ws) {
  H5Handle t = RowType(sizeof(TraceWindowRow), kTraceWindowFields);
  if (!t.valid()) return H5Fail("trace/windows type");
  // Each column is the WindowRecord field of its name (window.h's table).
  std::array<const WindowField*, kTraceWindowFields.size()> fields{};
  for (std::size_t i = 0; i < fields.size(); ++i) {
    fields[i] = FindWindowField(kTraceWindowFields[i].name);
    if (fields[i] == nullptr || fields[i]->kind == WindowFieldKind::kTokens)
      return Status::Runtime("trace/windows", std::string("column '") + kTraceWindowFields[i].name +
                                                  "' is no scalar field of WindowRecord");
  }
  std::vector<TraceWindowRow> rows;
  for (const auto& w : ws) {
    TraceWindowRow r{};
    for (std::size_t i = 0; i < kTraceWindowFields.size(); ++i)
      SetRowField(&r, kTraceWindowFields[i], fields[i]->get(w));
    rows.push_back(r);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      H5Handle ds, WriteRecords(file, lcpl, "trace/windows", t.get(), rows.data(), rows.size()));
  if (!AttrStr(ds.get(), "clock",
               "CLOCK_MONOTONIC ns around the instrumented calls; export_ns -1 = unknown"))
    return H5Fail("trace/windows attributes");
  return WriteStageTrace(file, lcpl, ws);
}

// /trace/steps and /trace/window_steps: only when the request took part in engine steps (an
// exporter that saw no OnStep writes neither: the layout of a run without steps is unchanged).
Status WriteSteps(hid_t file, hid_t lcpl, const std::vector<StepRecord>& steps,
                  const std::vector<WindowRecord>& ws) {
  if (steps.empty()) return Status::Ok();
  auto i64 = [](std::uint64_t v) {
    return static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX));
  };
  std::vector<TraceStepRow> rows;
  for (const StepRecord& s : steps)
    rows.push_back({s.step, s.begin_ns, s.end_ns, s.rows, s.seqs, s.verify_rows, s.prefill_rows,
                    s.queue_depth, s.live, i64(s.weight_bytes), i64(s.flops)});
  H5Handle t = RowType(sizeof(TraceStepRow), kTraceStepFields);
  if (!t.valid()) return H5Fail("trace/steps type");
  LOCKSTEP_ASSIGN_OR_RETURN(
      H5Handle ds, WriteRecords(file, lcpl, "trace/steps", t.get(), rows.data(), rows.size()));
  if (!AttrStr(ds.get(), "clock", "CLOCK_MONOTONIC ns around the step's forward"))
    return H5Fail("trace/steps attributes");
  std::vector<TraceWindowStepRow> map;
  for (const WindowRecord& w : ws) map.push_back({w.idx, 0, w.step});
  H5Handle mt = RowType(sizeof(TraceWindowStepRow), kTraceWindowStepFields);
  if (!mt.valid()) return H5Fail("trace/window_steps type");
  return WriteRecords(file, lcpl, "trace/window_steps", mt.get(), map.data(), map.size()).status();
}

Status WriteString(hid_t file, hid_t lcpl, const std::string& path, const std::string& text) {
  H5Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), text.empty() ? 1 : text.size());
  H5Handle sp(H5Screate(H5S_SCALAR));
  H5Handle ds(H5Dcreate2(file, path.c_str(), t.get(), sp.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
  const char zero = 0;
  if (!ds.valid() || H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                              text.empty() ? &zero : text.data()) < 0)
    return H5Fail(path);
  return Status::Ok();
}

}  // namespace

// A 1-D dataset of fixed-length (null-padded) strings (/injections, /ops/table).
Status WriteStrings(hid_t file, hid_t lcpl, const char* path,
                    const std::vector<std::string>& records) {
  std::size_t width = 1;
  for (const auto& r : records) width = std::max(width, r.size());
  std::string buf(width * records.size(), '\0');
  for (std::size_t i = 0; i < records.size(); ++i)
    std::memcpy(buf.data() + i * width, records[i].data(), records[i].size());
  H5Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), width);
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  hsize_t n = records.size();
  H5Handle sp(H5Screate_simple(1, &n, nullptr));
  H5Handle ds(H5Dcreate2(file, path, t.get(), sp.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
  if (!ds.valid() || H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
    return H5Fail(path);
  return Status::Ok();
}

namespace {

Status WriteTokens(hid_t file, hid_t lcpl, const std::string& path,
                   const std::vector<std::int32_t>& ids) {
  hsize_t n = ids.size();
  H5Handle sp(H5Screate_simple(1, &n, nullptr));
  H5Handle ds(
      H5Dcreate2(file, path.c_str(), H5T_STD_I32LE, sp.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
  if (!ds.valid() || (n > 0 && H5Dwrite(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                        ids.data()) < 0))
    return H5Fail(path);
  return Status::Ok();
}

Status WriteSamples(hid_t file, hid_t lcpl, const ExportRunInfo& meta) {
  std::vector<HostSampleRow> host;
  std::vector<DeviceSampleRow> dev;
  for (const auto& s : meta.samples) {
    host.push_back(
        {s.t_ns, s.host_available_bytes, s.swap_used_bytes, s.rss_bytes, s.process_cpu_ns});
    for (const auto& d : s.devices)
      dev.push_back({s.t_ns, d.index, d.free_bytes, d.total_bytes, d.temperature_c, d.sm_clock_mhz,
                     d.pcie_gen, d.pcie_width});
  }
  {
    H5Handle t = RowType(sizeof(HostSampleRow), kHostSampleFields);
    if (!t.valid()) return H5Fail("trace/samples type");
    LOCKSTEP_ASSIGN_OR_RETURN(
        H5Handle ds, WriteRecords(file, lcpl, "trace/samples", t.get(), host.data(), host.size()));
    const bool ok =
        AttrInt(ds.get(), "interval_min_ns", meta.sample_intervals.min_ns) &&
        AttrInt(ds.get(), "interval_median_ns", meta.sample_intervals.median_ns) &&
        AttrInt(ds.get(), "interval_max_ns", meta.sample_intervals.max_ns) &&
        AttrStr(ds.get(), "nvml",
                meta.nvml_unavailable.empty() ? "read" : "unknown: " + meta.nvml_unavailable) &&
        AttrStr(ds.get(), "guard", meta.guard) &&
        AttrStr(ds.get(), "unknown", "-1 in any field means not measured");
    if (!ok) return H5Fail("trace/samples attributes");
  }
  H5Handle t = RowType(sizeof(DeviceSampleRow), kDeviceSampleFields);
  if (!t.valid()) return H5Fail("trace/device_samples type");
  return WriteRecords(file, lcpl, "trace/device_samples", t.get(), dev.data(), dev.size()).status();
}

Status WriteEvents(hid_t file, hid_t lcpl, const ExportRunInfo& meta) {
  H5Handle t(H5Tcreate(H5T_COMPOUND, sizeof(TraceEvent)));
  H5Tinsert(t.get(), "t_ns", HOFFSET(TraceEvent, t_ns), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "id", HOFFSET(TraceEvent, id), H5T_NATIVE_UINT16);
  H5Tinsert(t.get(), "b", HOFFSET(TraceEvent, b), H5T_NATIVE_UINT16);
  H5Tinsert(t.get(), "a", HOFFSET(TraceEvent, a), H5T_NATIVE_INT32);
  LOCKSTEP_ASSIGN_OR_RETURN(H5Handle ds, WriteRecords(file, lcpl, "trace/events", t.get(),
                                                      meta.events.data(), meta.events.size()));
  const bool ok =
      AttrInt(ds.get(), "dropped", static_cast<std::int64_t>(meta.events_dropped)) &&
      AttrStr(ds.get(), "ids",
              "1 layer_begin(a=layer,b=stage) 2 layer_end 3 stage_begin(a=stage,b=T) 4 stage_end");
  return ok ? Status::Ok() : H5Fail("trace/events attributes");
}

Status FsyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0)
    return Status::IOError("export",
                           "cannot open '" + path + "' to fsync: " + std::strerror(errno));
  int r = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (r != 0 && !(directory && e == EINVAL))
    return Status::IOError("export", "fsync '" + path + "' failed: " + std::strerror(e));
  return Status::Ok();
}

Status WriteIndex(hid_t file, hid_t lcpl, const std::vector<IndexRow>& rows) {
  H5Handle t = IndexRowType();
  if (!t.valid()) return H5Fail("index/items type");
  return WriteRecords(file, lcpl, "index/items", t.get(), rows.data(), rows.size()).status();
}

}  // namespace

Status H5Exporter::Finish(const ExportRunInfo& meta) {
  if (finished_) return Status::Runtime("export", "Finish called twice");
  finished_ = true;
  File* f = file_.get();
  std::vector<WindowRecord> ws = windows_;
  std::vector<StepRecord> steps = steps_;
  auto ops = std::make_shared<OpCollector>(std::move(ops_));
  const bool abandon = quota_.over();
  Enqueue(
      [f, ws, steps, meta, ops, abandon] {
        if (abandon) return Status::Ok();  // the file is removed below
        const hid_t file = f->file.get(), lcpl = f->lcpl.get();
        LOCKSTEP_RETURN_IF_ERROR(WriteTrace(file, lcpl, ws));
        LOCKSTEP_RETURN_IF_ERROR(WriteSteps(file, lcpl, steps, ws));
        LOCKSTEP_RETURN_IF_ERROR(WriteIndex(file, lcpl, f->index));
        LOCKSTEP_RETURN_IF_ERROR(WriteSamples(file, lcpl, meta));
        LOCKSTEP_RETURN_IF_ERROR(WriteEvents(file, lcpl, meta));
        LOCKSTEP_RETURN_IF_ERROR(WriteString(file, lcpl, "config", meta.config_json));
        if (!meta.weights_json.empty())
          LOCKSTEP_RETURN_IF_ERROR(WriteString(file, lcpl, "weights", meta.weights_json));
        LOCKSTEP_RETURN_IF_ERROR(WriteTokens(file, lcpl, "request/tokens", meta.request_tokens));
        LOCKSTEP_RETURN_IF_ERROR(WriteTokens(file, lcpl, "output/tokens", meta.output_tokens));
        // /injections only when the run had some: a run without has the layout it always had.
        if (!meta.injections.empty())
          LOCKSTEP_RETURN_IF_ERROR(WriteStrings(file, lcpl, "injections", meta.injections));
        LOCKSTEP_RETURN_IF_ERROR(WriteOpTables(file, lcpl, *ops));
        for (const auto& r : meta.residency) {
          const std::string path = "residency/stage" + std::to_string(r.stage);
          hsize_t dims[2] = {static_cast<hsize_t>(r.layers), static_cast<hsize_t>(r.experts)};
          H5Handle sp(H5Screate_simple(2, dims, nullptr));
          H5Handle ds(H5Dcreate2(file, path.c_str(), H5T_STD_U8LE, sp.get(), lcpl, H5P_DEFAULT,
                                 H5P_DEFAULT));
          if (!ds.valid() || (!r.map.empty() && H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL,
                                                         H5S_ALL, H5P_DEFAULT, r.map.data()) < 0))
            return H5Fail(path);
        }
        for (const auto& c : meta.counters) {
          const std::string path = "counters/stage" + std::to_string(c.stage);
          H5Handle g(H5Gcreate2(file, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
          const bool ok = g.valid() && AttrInt(g.get(), "expert_hits", c.expert_hits) &&
                          AttrInt(g.get(), "expert_misses", c.expert_misses) &&
                          AttrInt(g.get(), "expert_bytes_fetched", c.expert_bytes_fetched) &&
                          AttrInt(g.get(), "host_expert_tokens", c.host_expert_tokens) &&
                          AttrInt(g.get(), "verify_calls", c.verify_calls) &&
                          AttrInt(g.get(), "first_calls", c.first_calls) &&
                          AttrInt(g.get(), "graph_captures", c.graph_captures) &&
                          AttrInt(g.get(), "graph_launches", c.graph_launches) &&
                          AttrInt(g.get(), "first_call_ns", c.first_call_ns);
          if (!ok) return H5Fail(path);
        }
        H5Handle req(H5Oopen(file, "request", H5P_DEFAULT)),
            out(H5Oopen(file, "output", H5P_DEFAULT));
        H5Handle root(H5Gopen2(file, "/", H5P_DEFAULT));
        bool ok =
            AttrInt(req.get(), "max_new", meta.max_new) &&
            AttrInt(req.get(), "seed", static_cast<std::int64_t>(meta.seed)) &&
            AttrStr(out.get(), "stop_reason", meta.stop_reason) &&
            AttrStr(out.get(), "text_sha256", meta.text_sha256) &&
            AttrStr(root.get(), "schema", "lockstep.export") &&
            AttrInt(root.get(), "schema_version", kExportSchemaVersion) &&
            AttrStr(root.get(), "arm", meta.arm) && AttrStr(root.get(), "run_id", meta.run_id) &&
            AttrStr(root.get(), "created_utc", meta.created_utc) &&
            AttrStr(root.get(), "executable_sha256", meta.executable_sha256) &&
            AttrStr(root.get(), "config_sha256", meta.config_sha256) &&
            AttrStr(root.get(), "model_sha256", meta.model_sha256) &&
            AttrStr(root.get(), "request_sha256", meta.request_sha256) &&
            AttrInt(root.get(), "seed", static_cast<std::int64_t>(meta.seed)) &&
            (meta.request_id.empty() || AttrStr(root.get(), "request_id", meta.request_id)) &&
            (meta.host_json.empty() || AttrStr(root.get(), "host", meta.host_json)) &&
            (meta.engine.empty() || AttrStr(root.get(), "engine", meta.engine)) &&
            (meta.engine_commit.empty() ||
             AttrStr(root.get(), "llama_cpp_commit", meta.engine_commit)) &&
            (meta.prefix_reuse.empty() ||
             (AttrStr(root.get(), "prefix_reuse", meta.prefix_reuse) &&
              AttrInt(root.get(), "prompt_tokens_reused", meta.prompt_tokens_reused))) &&
            (meta.preemptions.empty() || AttrStr(root.get(), "preemptions", meta.preemptions));
        return ok ? Status::Ok() : H5Fail("root attributes");
      },
      0);
  Status s = Drain();
  // Stop the writer, then close on this thread (the writer is gone: no concurrent HDF5 use).
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  f->lcpl.reset();
  errno = 0;
  const bool closed = f->file.reset();
  if (abandon) {
    ::unlink(partial_.c_str());
    return quota_.Error();
  }
  if (!s.ok()) return s;
  if (!closed) return Status::IOError("export", "closing '" + partial_ + "' failed" + SysError());
  LOCKSTEP_RETURN_IF_ERROR(FsyncPath(partial_, false));
  if (::rename(partial_.c_str(), opts_.path.c_str()) != 0)
    return Status::IOError(
        "export", "rename '" + partial_ + "' -> '" + opts_.path + "': " + std::strerror(errno));
  const auto slash = opts_.path.find_last_of('/');
  return FsyncPath(slash == std::string::npos ? "." : opts_.path.substr(0, slash == 0 ? 1 : slash),
                   true);
}

void AppendStageInfo(Engine& engine, std::int64_t verify_calls,
                     std::vector<ExportRunInfo::Residency>* residency,
                     std::vector<ExportRunInfo::Counters>* counters) {
  for (int is = 0; is < engine.n_stages(); ++is) {
    const ExpertCache& ec = engine.stage(is).experts();
    ExportRunInfo::Residency r;
    r.stage = is;
    r.layers = ec.n_layers();
    r.experts = ec.n_experts();
    for (int il = 0; il < ec.n_layers(); ++il)
      r.map.insert(r.map.end(), ec.map(il), ec.map(il) + ec.n_experts());
    residency->push_back(std::move(r));
    ExportRunInfo::Counters ct;
    ct.stage = is;
    ct.expert_hits = static_cast<std::int64_t>(ec.counters().hits);
    ct.expert_misses = static_cast<std::int64_t>(ec.counters().misses);
    ct.expert_bytes_fetched = static_cast<std::int64_t>(ec.counters().bytes_fetched);
    ct.host_expert_tokens = static_cast<std::int64_t>(ec.counters().host_tokens);
    ct.verify_calls = verify_calls;
    // The CPU backend does not separate first-call and graph-capture work from model work:
    // those stay unknown (-1); the cuda backend measures them and counts its graphs.
    const StageInitCounters ic = engine.stage(is).init_counters();
    ct.first_calls = ic.first_calls;
    ct.first_call_ns = ic.first_call_ns;
    ct.graph_captures = ic.graph_captures;
    ct.graph_launches = ic.graph_launches;
    counters->push_back(ct);
  }
}

}  // namespace lockstep
