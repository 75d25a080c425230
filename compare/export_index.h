// The export reader's state and its item index (private to compare/). ExportReader::Impl is
// shared by export_reader.cpp (Open, the root / trace / sampler tables, row reads) and
// export_index.cpp (the items: /index/items when the export has one, else the walk over every
// dataset under /checkpoints; where each item's rows are). Threading: built by Open() on one
// thread; afterwards only Read() and Find() are called, concurrently (Read's H5Dread fallback
// under h5_mu).
#pragma once

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "h5_bounded.h"
#include "lockstep/compare/export_reader.h"
#include "lockstep/h5/handle.h"
#include "lockstep/h5/rows.h"

namespace lockstep {

// Where one dataset's rows are and how to read them.
struct Loc {
  std::string path;  // in-file path (error messages, H5Dread fallback)
  std::vector<hsize_t> dims;
  std::int64_t rows = 0, row_bytes = 0;
  std::int64_t offset = -1;  // file offset of the raw contiguous data; -1: H5Dread fallback
  bool spilled = false;  // isolated open: offset is in Impl::spill_fd (the child decompressed it)
  hid_t mem_type = H5I_INVALID_HID;  // native type of the elements (predefined: never closed);
                                     // invalid in an isolated reader (never calls libhdf5)
};

struct ExportReader::Impl {
  ExportMeta meta;
  ReaderLimits limits;
  std::string file_path;
  int fd = -1;
  int spill_fd = -1;  // isolated: the unlinked file of the chunked items' rows (else -1)
  std::int64_t spill_bytes = 0;
  H5Handle file;             // kept open only when some dataset needs the H5Dread fallback
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
    if (spill_fd >= 0) ::close(spill_fd);
  }

  Status ReadAll();
  // ReadAll's steps (export_reader.cpp), in file order.
  Status ReadRoot();
  Status ReadTokens(const std::string& path, std::vector<std::int32_t>* out);
  Status ReadRequestAndOutput();
  Status ReadCounters();
  Status ReadWindows();
  Status ReadCheckpoints();
  Status ReadSampler();
  Status ReadStages();
  Status ReadSteps();
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
  // ReadIndexed's steps: every checkpoint group's attributes into meta.checkpoints (name -> its
  // index there); the rows of /index/items, type and size checked; one row as an item and its
  // location (every check of the slow path that the row allows); the cross-check of one item
  // against its dataset.
  Result<std::map<std::string, std::size_t>> ReadCheckpointGroups(hid_t cps,
                                                                  const std::vector<Link>& names);
  Result<std::vector<IndexRow>> ReadIndexRows();
  Result<ExportItem> IndexedItem(IndexRow& r, const std::string& where, const std::string& path,
                                 ItemLoc* il, std::int64_t* bytes);
  Status CrossCheck(const std::string& cp_name, const std::string& path, const ExportItem& it,
                    const ItemLoc& il, std::int64_t bytes);
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

// The checks both Open() paths make before libhdf5 sees the file, with the same messages: opens
// `path` read-only into impl.fd, fills *st, and refuses a missing, unreadable, non-regular, empty
// or non-HDF5 file (no signature at offset 0).
Status OpenExportFile(const std::string& path, ExportReader::Impl& impl, struct stat* st);

// Open() in this process: the whole validation through libhdf5 (export_reader.cpp). close_hdf5:
// close libhdf5's file when no item needs it (false: the isolated child, which only exits).
Result<std::unique_ptr<ExportReader::Impl>> OpenInProcess(const std::string& path,
                                                          const ReaderLimits& limits,
                                                          bool close_hdf5 = true);
// Open() in a forked child (isolated_open.cpp; export_reader.h "Isolation").
Result<std::unique_ptr<ExportReader::Impl>> OpenIsolated(const std::string& path,
                                                         const ReaderLimits& limits);

}  // namespace lockstep
