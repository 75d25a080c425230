#include "lockstep/engine/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "lockstep/engine/poison.h"
#include "util/check.h"

namespace lockstep {

struct KvPage {
  std::unique_ptr<std::byte[]> data;  // [2][page_rows][n_heads_kv*head_dim] elements
  std::unique_ptr<float[]> scales;    // [2][page_rows][n_heads_kv] (int8 only)
};

namespace {

// Poison (LOCKSTEP_POISON_FRESH): a fresh page reads as NaN in every dtype (int8 through NaN
// scales).
void FillNaN(DType dtype, std::byte* data, std::size_t elems, float* scales, std::size_t n_scales) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  switch (dtype) {
    case DType::kF32:
      std::fill_n(reinterpret_cast<float*>(data), elems, nan);
      break;
    case DType::kBF16:
      std::fill_n(reinterpret_cast<std::uint16_t*>(data), elems, f32_to_bf16(nan));
      break;
    default:
      std::fill_n(reinterpret_cast<std::int8_t*>(data), elems, std::int8_t{-128});
      break;
  }
  if (scales != nullptr) std::fill_n(scales, n_scales, nan);
}

}  // namespace

KvCache::KvCache(int n_heads_kv, int head_dim, DType dtype, int page_rows)
    : n_heads_kv_(n_heads_kv),
      head_dim_(head_dim),
      page_rows_(page_rows),
      dtype_(dtype),
      row_elems_(static_cast<std::size_t>(n_heads_kv) * static_cast<std::size_t>(head_dim)) {
  LOCKSTEP_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kI8)
      << dtype_name(dtype);
  LOCKSTEP_CHECK_GE(page_rows, 1);
}

void KvCache::EnsureCapacity(int rows) {
  const bool poison = PoisonFresh();
  const std::size_t elems = 2 * static_cast<std::size_t>(page_rows_) * row_elems_;
  const std::size_t n_scales =
      2 * static_cast<std::size_t>(page_rows_) * static_cast<std::size_t>(n_heads_kv_);
  while (rows_capacity() < rows) {
    auto p = std::make_shared<KvPage>();
    const std::size_t bytes = elems * dtype_size(dtype_);
    p->data.reset(new std::byte[bytes]());
    if (dtype_ == DType::kI8) p->scales.reset(new float[n_scales]());
    if (poison) FillNaN(dtype_, p->data.get(), elems, p->scales.get(), n_scales);
    pages_.push_back(std::move(p));
  }
}

void KvCache::MakeWritable(int row0, int n) {
  if (n <= 0) return;
  const std::size_t first = static_cast<std::size_t>(row0 / page_rows_),
                    last = static_cast<std::size_t>((row0 + n - 1) / page_rows_);
  const std::size_t bytes =
      2 * static_cast<std::size_t>(page_rows_) * row_elems_ * dtype_size(dtype_);
  const std::size_t n_scales =
      2 * static_cast<std::size_t>(page_rows_) * static_cast<std::size_t>(n_heads_kv_);
  for (std::size_t i = first; i <= last && i < pages_.size(); ++i) {
    if (pages_[i].use_count() <= 1) continue;
    const KvPage& src = *pages_[i];
    auto p = std::make_shared<KvPage>();
    p->data.reset(new std::byte[bytes]);
    std::memcpy(p->data.get(), src.data.get(), bytes);
    if (src.scales) {
      p->scales.reset(new float[n_scales]);
      std::memcpy(p->scales.get(), src.scales.get(), n_scales * sizeof(float));
    }
    pages_[i] = std::move(p);
  }
}

std::byte* KvCache::RowPtrMut(int which, int row) {
  return const_cast<std::byte*>(RowPtr(which, row));
}

const std::byte* KvCache::RowPtr(int which, int row) const {
  const KvPage& p = *pages_[static_cast<std::size_t>(row / page_rows_)];
  std::size_t r = static_cast<std::size_t>(which) * static_cast<std::size_t>(page_rows_) +
                  static_cast<std::size_t>(row % page_rows_);
  return p.data.get() + r * row_elems_ * dtype_size(dtype_);
}

const float* KvCache::ScalePtr(int which, int row) const {
  if (dtype_ != DType::kI8) return nullptr;
  const KvPage& p = *pages_[static_cast<std::size_t>(row / page_rows_)];
  std::size_t r = static_cast<std::size_t>(which) * static_cast<std::size_t>(page_rows_) +
                  static_cast<std::size_t>(row % page_rows_);
  return p.scales.get() + r * static_cast<std::size_t>(n_heads_kv_);
}

float* KvCache::ScalePtrMut(int which, int row) { return const_cast<float*>(ScalePtr(which, row)); }

void KvCache::StoreRow(int which, int row, const float* src) {
  std::byte* dst = RowPtrMut(which, row);
  const std::size_t hd = static_cast<std::size_t>(head_dim_);
  switch (dtype_) {
    case DType::kF32:
      std::memcpy(dst, src, row_elems_ * sizeof(float));
      break;
    case DType::kBF16: {
      auto* d = reinterpret_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < row_elems_; ++i) d[i] = f32_to_bf16(src[i]);
      break;
    }
    case DType::kI8: {
      auto* d = reinterpret_cast<std::int8_t*>(dst);
      float* scales = ScalePtrMut(which, row);
      for (int h = 0; h < n_heads_kv_; ++h) {
        std::size_t off = static_cast<std::size_t>(h) * hd;
        scales[h] = quantize_int8_row(src + off, hd, d + off);
      }
      break;
    }
    default:
      LOCKSTEP_CHECK(false) << "unreachable dtype";
  }
}

void KvCache::ScaleRows(int which, int row0, int n, float factor) {
  LOCKSTEP_CHECK(row0 >= rows_committed_ && row0 + n <= rows_written_)
      << "ScaleRows outside the speculative rows";
  MakeWritable(row0, n);
  for (int r = row0; r < row0 + n; ++r) {
    std::byte* dst = RowPtrMut(which, r);
    switch (dtype_) {
      case DType::kF32: {
        auto* d = reinterpret_cast<float*>(dst);
        for (std::size_t i = 0; i < row_elems_; ++i) d[i] *= factor;
        break;
      }
      case DType::kBF16: {
        auto* d = reinterpret_cast<std::uint16_t*>(dst);
        for (std::size_t i = 0; i < row_elems_; ++i) d[i] = f32_to_bf16(bf16_to_f32(d[i]) * factor);
        break;
      }
      case DType::kI8: {
        float* scales = ScalePtrMut(which, r);
        for (int h = 0; h < n_heads_kv_; ++h) scales[h] *= factor;
        break;
      }
      default:
        LOCKSTEP_CHECK(false) << "unreachable dtype";
    }
  }
}

void KvCache::Write(int pos, int n, const float* k, const float* v) {
  LOCKSTEP_CHECK(pos >= rows_committed_ && pos <= rows_written_)
      << "write at " << pos << " with committed=" << rows_committed_
      << " written=" << rows_written_;
  EnsureCapacity(pos + n);
  MakeWritable(pos, n);
  for (int t = 0; t < n; ++t) {
    StoreRow(0, pos + t, k + static_cast<std::size_t>(t) * row_elems_);
    StoreRow(1, pos + t, v + static_cast<std::size_t>(t) * row_elems_);
  }
  rows_written_ = pos + n;
}

void KvCache::WriteRaw(int pos, int n, const std::byte* k, const std::byte* v,
                       const float* k_scales, const float* v_scales) {
  LOCKSTEP_CHECK(pos >= rows_committed_ && pos <= rows_written_)
      << "raw write at " << pos << " with committed=" << rows_committed_
      << " written=" << rows_written_;
  EnsureCapacity(pos + n);
  MakeWritable(pos, n);
  const std::size_t rb = row_bytes(), hk = static_cast<std::size_t>(n_heads_kv_);
  for (int t = 0; t < n; ++t) {
    const std::size_t ut = static_cast<std::size_t>(t);
    std::memcpy(RowPtrMut(0, pos + t), k + ut * rb, rb);
    std::memcpy(RowPtrMut(1, pos + t), v + ut * rb, rb);
    if (dtype_ == DType::kI8) {
      std::memcpy(ScalePtrMut(0, pos + t), k_scales + ut * hk, hk * sizeof(float));
      std::memcpy(ScalePtrMut(1, pos + t), v_scales + ut * hk, hk * sizeof(float));
    }
  }
  rows_written_ = pos + n;
}

void KvCache::OverwriteRows(int which, int row0, int n, const std::byte* src, const float* scales) {
  LOCKSTEP_CHECK(row0 >= 0 && n >= 0 && row0 + n <= rows_written_)
      << "overwrite of rows [" << row0 << ", " << row0 + n << ") with written=" << rows_written_;
  MakeWritable(row0, n);
  const std::size_t rb = row_bytes(), hk = static_cast<std::size_t>(n_heads_kv_);
  for (int t = 0; t < n; ++t) {
    const std::size_t ut = static_cast<std::size_t>(t);
    std::memcpy(RowPtrMut(which, row0 + t), src + ut * rb, rb);
    if (dtype_ == DType::kI8)
      std::memcpy(ScalePtrMut(which, row0 + t), scales + ut * hk, hk * sizeof(float));
  }
}

void KvCache::Commit(int rows) {
  LOCKSTEP_CHECK(rows >= rows_committed_ && rows <= rows_written_)
      << "commit " << rows << " with committed=" << rows_committed_ << " written=" << rows_written_;
  rows_committed_ = rows;
  rows_written_ = rows;
}

const float* KvCache::Get(int which, int row, int head, float* tmp) const {
  const std::size_t hd = static_cast<std::size_t>(head_dim_);
  const std::byte* base = RowPtr(which, row);
  switch (dtype_) {
    case DType::kF32:
      return reinterpret_cast<const float*>(base) + static_cast<std::size_t>(head) * hd;
    case DType::kBF16: {
      const auto* s =
          reinterpret_cast<const std::uint16_t*>(base) + static_cast<std::size_t>(head) * hd;
      for (std::size_t i = 0; i < hd; ++i) tmp[i] = bf16_to_f32(s[i]);
      return tmp;
    }
    case DType::kI8: {
      const auto* s =
          reinterpret_cast<const std::int8_t*>(base) + static_cast<std::size_t>(head) * hd;
      dequantize_int8_row(s, ScalePtr(which, row)[head], hd, tmp);
      return tmp;
    }
    default:
      LOCKSTEP_CHECK(false) << "unreachable dtype";
  }
  return nullptr;
}

std::size_t KvCache::page_bytes() const {
  std::size_t per_page = 2 * static_cast<std::size_t>(page_rows_) * row_elems_ * dtype_size(dtype_);
  if (dtype_ == DType::kI8)
    per_page += 2 * static_cast<std::size_t>(page_rows_) * static_cast<std::size_t>(n_heads_kv_) *
                sizeof(float);
  return per_page;
}

int KvCache::pages_shared() const {
  int n = 0;
  for (const auto& p : pages_) n += p.use_count() > 1 ? 1 : 0;
  return n;
}

KvPrefixPtr KvCache::Prefix(int rows) const {
  LOCKSTEP_CHECK(rows >= 0 && rows <= rows_committed_)
      << "prefix of " << rows << " rows with committed=" << rows_committed_;
  auto out = std::make_shared<KvPrefix>();
  out->rows = rows;
  out->n_heads_kv = n_heads_kv_;
  out->head_dim = head_dim_;
  out->page_rows = page_rows_;
  out->dtype = dtype_;
  out->page_bytes = page_bytes();
  const std::size_t n_pages = static_cast<std::size_t>((rows + page_rows_ - 1) / page_rows_);
  out->pages.assign(pages_.begin(), pages_.begin() + static_cast<std::ptrdiff_t>(n_pages));
  return out;
}

bool KvCache::Fits(const KvPrefix& prefix) const {
  return prefix.n_heads_kv == n_heads_kv_ && prefix.head_dim == head_dim_ &&
         prefix.page_rows == page_rows_ && prefix.dtype == dtype_ &&
         prefix.pages.size() ==
             static_cast<std::size_t>((prefix.rows + page_rows_ - 1) / page_rows_);
}

void KvCache::AdoptPrefix(const KvPrefixPtr& prefix) {
  LOCKSTEP_CHECK(prefix != nullptr && Fits(*prefix)) << "prefix does not fit this cache";
  LOCKSTEP_CHECK_EQ(rows_written_, 0);
  pages_ = prefix->pages;
  rows_committed_ = rows_written_ = prefix->rows;
}

}  // namespace lockstep
