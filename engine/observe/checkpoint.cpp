#include "observe/checkpoint.h"

namespace lockstep {

namespace {

// K or V rows [first, first + n) of a cache as a row view.
StateView KvView(const KvCache& kv, ItemKind kind, int stage, int layer, bool is_v, int first,
                 int n) {
  StateView v;
  v.kind = kind;
  v.stage = stage;
  v.layer = layer;
  v.dtype = kv.dtype();
  v.shape = {n, kv.n_heads_kv(), kv.head_dim()};
  v.rows = n;
  v.rows_capacity = kv.rows_capacity();
  v.row_bytes = kv.row_bytes();
  const KvCache* c = &kv;
  v.row = [c, is_v, first](int r) { return is_v ? c->VRaw(first + r) : c->KRaw(first + r); };
  if (kv.dtype() == DType::kI8)
    v.scales = [c, is_v, first](int r) {
      return is_v ? c->VScales(first + r) : c->KScales(first + r);
    };
  return v;
}

// A contiguous f32 tensor of `rows` rows as a row view.
StateView DenseView(ItemKind kind, int stage, int layer, const float* data,
                    std::vector<std::int64_t> shape) {
  StateView v;
  v.kind = kind;
  v.stage = stage;
  v.layer = layer;
  v.dtype = DType::kF32;
  v.rows = static_cast<int>(shape[0]);
  v.rows_capacity = v.rows;
  std::size_t per_row = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) per_row *= static_cast<std::size_t>(shape[i]);
  v.row_bytes = per_row * sizeof(float);
  v.shape = std::move(shape);
  v.row = [data, per_row](int r) {
    return reinterpret_cast<const std::byte*>(data + static_cast<std::size_t>(r) * per_row);
  };
  return v;
}

}  // namespace

void EmitCheckpoint(Engine& engine, Observer& observer, const CheckpointInfo& info,
                    const float* logits) {
  const bool post = info.point == CheckpointPoint::kPostVerify;
  const ModelConfig& c = engine.weights().config;
  observer.OnCheckpointBegin(info);
  for (int is = 0; is < engine.n_stages(); ++is) {
    StageSession& s = engine.stage(is);
    for (int il = s.layer_begin(); il < s.layer_end(); ++il) {
      if (KvCache* kv = s.kv(il)) {
        const int committed = kv->rows_committed();
        observer.OnState(info, KvView(*kv, ItemKind::kK, is, il, false, 0, committed));
        observer.OnState(info, KvView(*kv, ItemKind::kV, is, il, true, 0, committed));
        if (post) {
          observer.OnState(
              info, KvView(*kv, ItemKind::kKSpec, is, il, false, committed, kv->rows_spec()));
          observer.OnState(info,
                           KvView(*kv, ItemKind::kVSpec, is, il, true, committed, kv->rows_spec()));
        }
      }
      if (GdnState* g = s.gdn(il)) {
        observer.OnState(info, DenseView(ItemKind::kConvState, is, il, g->conv(),
                                         {g->conv_rows(), g->conv_dim()}));
        observer.OnState(info, DenseView(ItemKind::kSsmState, is, il, g->ssm(),
                                         {c.n_v_heads, c.k_head_dim, c.v_head_dim}));
      }
    }
    if (KvCache* m = s.mtp_kv()) {
      observer.OnState(info, KvView(*m, ItemKind::kMtpK, is, -1, false, 0, m->rows_committed()));
      observer.OnState(info, KvView(*m, ItemKind::kMtpV, is, -1, true, 0, m->rows_committed()));
    }
    if (post && !s.is_last() && !engine.hidden_out(is).empty())
      observer.OnState(info, DenseView(ItemKind::kHiddenOut, is, -1, engine.hidden_out(is).data(),
                                       {info.T, c.n_embd}));
    if (post && s.is_last() && logits != nullptr)
      observer.OnState(info, DenseView(ItemKind::kLogits, is, -1, logits, {info.T, c.n_vocab}));
  }
  observer.OnCheckpointEnd(info);
}

}  // namespace lockstep
