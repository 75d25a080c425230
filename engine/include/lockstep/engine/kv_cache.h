// Paged K/V cache of one full-attention layer (or the MTP layer) for one sequence.
//
// Rows are token positions. The cache distinguishes
//   committed rows   [0, rows_committed)                       accepted state
//   speculative rows [rows_committed, rows_committed+rows_spec) written by the current verify
//   unused tail      [rows_written, rows_capacity)             allocated page space, never valid
// A verify writes its T rows as speculative; Commit(n) makes a prefix of them committed and
// discards the rest (rollback is just the valid length: rejected rows are later overwritten).
// Committed rows are never overwritten (a programmer error, checked).
//
// Storage: f32, bf16 or int8 per `dtype`; int8 keeps one f32 scale per (row, head)
// (symmetric, scale = max|x|/127). Rows are quantised independently, so a row's stored bits do
// not depend on how many rows were written together (batch invariance).
//
// Pages are shared (reference counted): Prefix(rows) hands out the pages holding committed rows
// [0, rows) without copying them, AdoptPrefix installs them in an empty cache (the prefix cache,
// engine/serve). Copy on write: Write, WriteRaw and ScaleRows first clone every page they touch
// that another holder also references, so no holder ever sees another's writes. Pages are
// allocated lazily as rows are written (zero-filled; NaN with LOCKSTEP_POISON_FRESH=1, poison.h).
//
// Thread safety: none; owned and used by one stage session. A shared page is only read by its
// other holders while it is shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/engine/dtype.h"

namespace lockstep {

// One page of a cache: K and V of page_rows rows (and their int8 scales). Defined in
// kv_cache.cpp; holders only count references.
struct KvPage;

// Committed rows [0, rows) of one cache as read-only pages shared with the cache that made it and
// every cache that adopts it (prefix cache, engine/serve). Copy on write: a cache copies a shared
// page before writing into it, so no holder ever sees another's writes. The last page may hold
// rows past `rows` (never valid for an adopter: it overwrites them, after its copy).
struct KvPrefix {
  int rows = 0;
  int n_heads_kv = 0, head_dim = 0, page_rows = 0;
  DType dtype = DType::kF32;
  std::size_t page_bytes = 0;                  // bytes of one page (K + V + int8 scales)
  std::vector<std::shared_ptr<KvPage>> pages;  // ceil(rows / page_rows) pages, in row order
  std::size_t bytes() const { return page_bytes * pages.size(); }
};
using KvPrefixPtr = std::shared_ptr<const KvPrefix>;

class KvCache {
 public:
  KvCache(int n_heads_kv, int head_dim, DType dtype, int page_rows);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  KvCache(KvCache&&) = default;

  // Writes rows [pos, pos+n) from f32 k, v [n, n_heads_kv, head_dim]. Requires
  // rows_committed() <= pos <= rows_written() (no holes, no committed overwrite). Rows past
  // rows_committed() are speculative until Commit.
  void Write(int pos, int n, const float* k, const float* v);
  // Writes rows [pos, pos+n) from raw stored elements (mirrors of a device cache): k, v are
  // dtype-sized [n, n_heads_kv, head_dim]; for int8, k_scales / v_scales f32 [n, n_heads_kv]
  // (ignored otherwise). Same position rules as Write.
  void WriteRaw(int pos, int n, const std::byte* k, const std::byte* v, const float* k_scales,
                const float* v_scales);
  // Rows [0, rows) become committed; rows_committed() <= rows <= rows_written(). Everything past
  // `rows` is discarded (rows_spec() becomes 0).
  void Commit(int rows);
  // Fault injection (inject.h `perturb`): multiplies K (which = 0) or V (1) of rows [row0, row0+n)
  // by `factor` in place (f32 exactly, bf16 re-rounded, int8 through the per-row scales).
  // Rows must be written and not committed.
  void ScaleRows(int which, int row0, int n, float factor);
  // State transplant (graft.h): overwrites K (which = 0) or V (1) of written rows
  // [row0, row0+n) with raw stored elements src [n, n_heads_kv, head_dim] (dtype-sized) and, for
  // int8, scales f32 [n, n_heads_kv] (ignored otherwise). Committed rows may be overwritten
  // (shared pages are copied first). Requires row0 + n <= rows_written().
  void OverwriteRows(int which, int row0, int n, const std::byte* src, const float* scales);
  // Drops all speculative rows.
  void DiscardSpeculative() { rows_written_ = rows_committed_; }
  // Rows [0, rows) (rows <= rows_committed()) as shared pages; cheap (no row is copied).
  KvPrefixPtr Prefix(int rows) const;
  // True when `prefix` fits this cache (same heads, head_dim, dtype and page size).
  bool Fits(const KvPrefix& prefix) const;
  // An empty cache (nothing written) takes `prefix`'s rows as its committed rows, sharing its
  // pages. Requires Fits(*prefix).
  void AdoptPrefix(const KvPrefixPtr& prefix);

  int rows_committed() const { return rows_committed_; }
  int rows_spec() const { return rows_written_ - rows_committed_; }
  int rows_written() const { return rows_written_; }
  int rows_capacity() const { return static_cast<int>(pages_.size()) * page_rows_; }
  int n_heads_kv() const { return n_heads_kv_; }
  int head_dim() const { return head_dim_; }
  int page_rows() const { return page_rows_; }
  DType dtype() const { return dtype_; }

  // f32 view of K (or V) at (row, head): a pointer into the page for f32 storage, otherwise
  // the row is dequantised into `tmp` [head_dim] and tmp is returned.
  const float* K(int row, int head, float* tmp) const { return Get(0, row, head, tmp); }
  const float* V(int row, int head, float* tmp) const { return Get(1, row, head, tmp); }

  // Raw storage of one row (all heads) for export: dtype-sized elements
  // [n_heads_kv, head_dim], and for int8 the f32 scales [n_heads_kv] (nullptr otherwise).
  const std::byte* KRaw(int row) const { return RowPtr(0, row); }
  const std::byte* VRaw(int row) const { return RowPtr(1, row); }
  const float* KScales(int row) const { return ScalePtr(0, row); }
  const float* VScales(int row) const { return ScalePtr(1, row); }
  std::size_t row_bytes() const { return row_elems_ * dtype_size(dtype_); }
  std::size_t page_bytes() const;
  // Bytes of all pages this cache references (shared ones included).
  std::size_t bytes_reserved() const { return page_bytes() * pages_.size(); }
  // Pages this cache references that another holder (a prefix, another cache) also references.
  int pages_shared() const;

 private:
  const float* Get(int which, int row, int head, float* tmp) const;
  const std::byte* RowPtr(int which, int row) const;
  std::byte* RowPtrMut(int which, int row);  // requires the row's page to be writable
  const float* ScalePtr(int which, int row) const;
  float* ScalePtrMut(int which, int row);
  void EnsureCapacity(int rows);
  // Copy on write: clones every shared page holding a row of [row0, row0 + n).
  void MakeWritable(int row0, int n);
  void StoreRow(int which, int row, const float* src);

  int n_heads_kv_, head_dim_, page_rows_;
  DType dtype_;
  std::size_t row_elems_;  // n_heads_kv * head_dim
  std::vector<std::shared_ptr<KvPage>> pages_;
  int rows_committed_ = 0;
  int rows_written_ = 0;
};

}  // namespace lockstep
