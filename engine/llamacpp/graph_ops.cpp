#include "graph_ops.h"

#include <cstring>
#include <set>
#include <string_view>

#include "lockstep/engine/dtype.h"

namespace lockstep {

namespace {

// ggml names views after what they view ("attn_norm-3 (reshaped)", "x (view) (permuted)"): the
// tensor the data is.
std::string_view BaseName(const char* name) {
  std::string_view s(name);
  const auto p = s.find(" (");
  return p == std::string_view::npos ? s : s.substr(0, p);
}

// A name the graph builder gave (cb(cur, "attn_norm", il) -> "attn_norm-3"): non-empty, no
// spaces (ggml's derived names have them), not ggml's "node_N"/"leaf_N" defaults.
bool IsGivenName(std::string_view s) {
  return !s.empty() && s.find(' ') == std::string_view::npos && s.rfind("node_", 0) != 0 &&
         s.rfind("leaf_", 0) != 0;
}

// "attn_norm-3" -> 3; -1 without a layer suffix.
int LayerOf(std::string_view s) {
  const auto d = s.rfind('-');
  if (d == std::string_view::npos || d + 1 >= s.size()) return -1;
  int v = 0;
  for (std::size_t i = d + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || v > 100000) return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

std::size_t ElemBytes(ggml_type t) {
  switch (t) {
    case GGML_TYPE_F32:
    case GGML_TYPE_I32:
      return 4;
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
      return 2;
    default:
      return 0;  // quantised or other: not reported
  }
}

float ToFloat(ggml_type t, const std::byte* p) {
  switch (t) {
    case GGML_TYPE_F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case GGML_TYPE_I32: {
      std::int32_t i;
      std::memcpy(&i, p, 4);
      return static_cast<float>(i);
    }
    case GGML_TYPE_F16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    default: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
  }
}

// Named non-leaf tensors `t` reads, through unnamed and derived (view) tensors.
void CollectInputs(const ggml_tensor* t, int depth, std::set<std::string>* seen, std::string* out) {
  for (const ggml_tensor* s : t->src) {
    if (s == nullptr || s->op == GGML_OP_NONE) continue;  // weights and graph inputs
    const std::string_view base = BaseName(s->name);
    if (IsGivenName(base)) {
      if (seen->insert(std::string(base)).second)
        *out += (out->empty() ? "" : ",") + std::string(base);
    } else if (depth < 8) {
      CollectInputs(s, depth + 1, seen, out);
    }
  }
}

}  // namespace

void GraphOps::BeginCall(int window, std::vector<int> row_pos, int n_seqs,
                         const std::function<void(const OpRecord&)>* sink) {
  window_ = window;
  row_pos_ = std::move(row_pos);
  n_seqs_ = n_seqs;
  sink_ = sink;
}

bool GraphOps::Callback(ggml_tensor* t, bool ask, void* user_data) {
  auto* self = static_cast<GraphOps*>(user_data);
  if (self->sink_ == nullptr) return !ask;  // asked: not wanted; computed: go on
  if (ask) return self->Wants(t);
  self->Report(t);
  return true;
}

// The outermost dimension that counts the call's tokens with only size-1 dimensions above it
// (a row is then one contiguous-index block); -1 when there is none.
int GraphOps::TokenDim(const ggml_tensor* t) const {
  const auto n_tok = static_cast<std::int64_t>(row_pos_.size());
  for (int d = GGML_MAX_DIMS - 1; d >= 1; --d) {
    if (t->ne[d] == n_tok) return d;
    if (t->ne[d] != 1) return -1;
  }
  return -1;
}

bool GraphOps::Wants(const ggml_tensor* t) const {
  if (t->op == GGML_OP_NONE || ElemBytes(t->type) == 0 || !IsGivenName(t->name)) return false;
  if (row_pos_.size() == 1) return true;
  return TokenDim(t) >= 0 || n_seqs_ == 1;
}

const OpDef* GraphOps::DefFor(const ggml_tensor* t) {
  const std::string_view name(t->name);
  if (auto it = by_name_.find(name); it != by_name_.end()) return it->second;
  DefStore& d = defs_.emplace_back();
  d.name = std::string(name);
  std::set<std::string> seen;
  CollectInputs(t, 0, &seen, &d.inputs);
  d.def = OpDef{d.name.c_str(), d.inputs.c_str(), false};
  by_name_.emplace(d.name, &d.def);
  return &d.def;
}

void GraphOps::Report(const ggml_tensor* t) {
  const std::size_t es = ElemBytes(t->type);
  const std::size_t nbytes = lib_.ggml_nbytes(t);
  bytes_.resize(nbytes);
  lib_.ggml_backend_tensor_get(t, bytes_.data(), 0, nbytes);
  const int td = row_pos_.size() == 1 ? -1 : TokenDim(t);
  const std::int64_t n_rows = td < 0 ? 1 : t->ne[td];
  std::int64_t width = 1;
  for (int d = 0; d < GGML_MAX_DIMS; ++d)
    if (d != td) width *= t->ne[d];
  const OpDef* def = DefFor(t);
  int row_index = 0;
  for (std::int64_t r = 0; r < n_rows; ++r) {
    int position = -1;
    if (td < 0) {  // the whole tensor: the request's first row names it
      for (int p : row_pos_)
        if (p >= 0) {
          position = p;
          break;
        }
    } else {
      position = row_pos_[static_cast<std::size_t>(r)];
    }
    if (position < 0) continue;
    row_bytes_.resize(static_cast<std::size_t>(width) * es);
    row_floats_.resize(static_cast<std::size_t>(width));
    // Elements in index order (dimension 0 fastest), whatever the strides (views, permutes).
    std::size_t k = 0;
    for (std::int64_t i3 = 0; i3 < (td == 3 ? 1 : t->ne[3]); ++i3)
      for (std::int64_t i2 = 0; i2 < (td == 2 ? 1 : t->ne[2]); ++i2)
        for (std::int64_t i1 = 0; i1 < (td == 1 ? 1 : t->ne[1]); ++i1)
          for (std::int64_t i0 = 0; i0 < t->ne[0]; ++i0, ++k) {
            const std::int64_t idx[4] = {i0, td == 1 ? r : i1, td == 2 ? r : i2, td == 3 ? r : i3};
            std::size_t off = 0;
            for (int d = 0; d < 4; ++d) off += static_cast<std::size_t>(idx[d]) * t->nb[d];
            std::memcpy(row_bytes_.data() + k * es, bytes_.data() + off, es);
            row_floats_[k] = ToFloat(t->type, bytes_.data() + off);
          }
    OpRecord rec;
    rec.def = def;
    rec.window = window_;
    rec.stage = 0;
    rec.layer = LayerOf(def->name);
    rec.index = -1;
    rec.position = position;
    rec.row = row_index++;
    rec.digest = RowDigest(row_bytes_.data(), row_bytes_.size());
    rec.l2 = RowL2(row_floats_.data(), row_floats_.size());
    rec.data = row_floats_.data();
    rec.width = row_floats_.size();
    (*sink_)(rec);
  }
}

}  // namespace lockstep
