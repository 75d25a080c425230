// safetensors reading (mmap, single file or sharded with model.safetensors.index.json) and
// writing (deterministic, atomic).
//
// File format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the start of the data section.
//
// Every size read from a file is checked before use: header length against the file size,
// offsets against the data section, offsets against dtype x shape, overlapping or unordered
// ranges, unknown dtypes, non-integer or negative shape entries. Each problem is a kCorruption
// Status naming the file and tensor, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// One tensor inside a mapped file. `data` points into the mapping and lives as long as the
// SafetensorsFile (or TensorStore) that produced it. `data` is NOT necessarily aligned (the data
// section starts at 8 + header length): read it with memcpy or convert_to_f32.
// nbytes == numel() x dtype_size(dtype) for every tensor a parse returns.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;  // outermost first
  const std::byte* data = nullptr;
  std::size_t nbytes = 0;
  std::string file;  // file the tensor came from (for messages)

  std::int64_t numel() const;
};

// A read-only mmap of one .safetensors file. Non-copyable; tensors borrow its mapping.
class SafetensorsFile {
 public:
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Opens and validates `path`: open + fstat + mmap(PROT_READ, MAP_PRIVATE); the mapping is
  // released by the destructor. Errors: kNotFound (missing), kIOError (unreadable, a folder,
  // mmap failure), kCorruption (anything malformed, including a file under 8 bytes; the message
  // names the file and, where known, the tensor, e.g. "safetensors 'm.safetensors': tensor 'w':
  // data_offsets [0, 8) past the end of the data section (size 4) (hint: the file may be
  // truncated)"). Checks: header length <= file size - 8 and <= 100 MiB; header is a JSON
  // object without repeated keys, nested at most 8 deep; each entry has a known "dtype", a "shape"
  // of non-negative integers (product overflow-checked), "data_offsets" [begin, end] inside the
  // data section with end - begin == numel x dtype size; non-empty ranges do not overlap;
  // "__metadata__", if present, maps strings to strings. Gaps between ranges are allowed. Thread
  // safety: a parsed file is immutable; concurrent readers are fine.
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates an in-memory image (same checks as Open; `bytes` must outlive the result).
  // Used by the fuzz test and the fuzz target.
  static Result<std::unique_ptr<SafetensorsFile>> FromMemory(std::span<const std::byte> bytes,
                                                             std::string label);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const TensorInfo* Find(std::string_view name) const;                 // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  Status Parse(std::span<const std::byte> bytes);

  std::string path_;
  void* map_ = nullptr;  // mmap base (null for FromMemory)
  std::size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};
using SafetensorsFilePtr = std::unique_ptr<SafetensorsFile>;

// All tensors of a checkpoint folder: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` ("weight_map": name -> shard file), or, failing both, every
// `*.safetensors` in the folder. A tensor name present in two files is kCorruption.
class TensorStore {
 public:
  // Lookup order: (1) the index, if present, wins: each distinct shard it names is opened once
  // (sorted by file name) and every weight_map name must be in its shard; tensors a shard holds
  // beyond its weight_map entries are kept. (2) else `model.safetensors` alone (other
  // *.safetensors files are ignored). (3) else every regular `*.safetensors` (symlinks followed)
  // in sorted order.
  // Errors: kNotFound (folder missing; no checkpoint file at all, with a 'lockstep model init'
  // hint; a shard the index names is missing, naming the shard and one tensor), kCorruption (bad
  // index JSON, a non-string or absolute / '..' shard name, a weight_map name absent from its
  // shard, a name in two files, or any error of SafetensorsFile::Open), kIOError.
  static Result<std::unique_ptr<TensorStore>> OpenDir(const std::string& dir);

  const TensorInfo* Find(std::string_view name) const;                   // nullptr if absent
  std::vector<std::string> Names() const;                                // sorted
  const std::vector<std::string>& files() const { return file_paths_; }  // in opening order

 private:
  std::vector<SafetensorsFilePtr> files_;
  std::vector<std::string> file_paths_;
  std::map<std::string, const TensorInfo*, std::less<>> index_;
};
using TensorStorePtr = std::unique_ptr<TensorStore>;

// A tensor to write. `data` holds exactly numel x dtype_size bytes (little-endian).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;
};

// Writes a .safetensors file: tensors sorted by name, contiguous data, header padded with
// spaces to a multiple of 8 bytes, byte-identical for identical input (the order of `tensors`
// does not matter). Header JSON: compact, keys sorted, "__metadata__" only when non-empty.
// Written atomically through AtomicFileWriter (path.tmp.<pid>, fsync, rename, fsync of the
// folder), streaming header then each tensor: the file is never assembled in memory.
// Errors: kInvalidArgument (data size != numel x dtype size, negative dimension, duplicate,
// empty or "__metadata__" name, names / metadata not UTF-8; a missing folder; nothing is written),
// kIOError.
Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace lockstep
