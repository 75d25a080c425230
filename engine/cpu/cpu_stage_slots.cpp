// CpuStageSession's slot snapshots (stage.h): a slot's committed state as shared K/V pages plus
// copies of its GDN checkpoints, and the restore of one into a fresh slot.
#include <string>

#include "cpu/cpu_stage.h"
#include "util/check.h"

namespace lockstep {

namespace {
inline std::size_t U(int x) { return static_cast<std::size_t>(x); }
Status Bad(const std::string& why) { return Status::InvalidArgument("slot snapshot", why); }
}  // namespace

Result<StageSlotSnapshot> CpuStageSession::SnapshotSlot(int s) {
  if (s < 0 || s >= max_slots_) return Bad("slot " + std::to_string(s) + " does not exist");
  if (!slots_[U(s)]) slots_[U(s)] = NewSlot();
  const SlotState& st = *slots_[U(s)];
  if (st.pending_rows != 0)
    return Status::Runtime("slot snapshot", "slot " + std::to_string(s) + " has " +
                                                std::to_string(st.pending_rows) +
                                                " uncommitted verify rows");
  StageSlotSnapshot snap;
  snap.position = st.position;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const std::size_t l = U(il - layer_begin());
    if (const KvCache* kv = st.kv[l].get()) {
      LOCKSTEP_CHECK_EQ(kv->rows_committed(), st.position);
      snap.kv.emplace_back(il, kv->Prefix(st.position));
    } else if (const GdnState* g = st.gdn[l].get()) {
      LOCKSTEP_CHECK_EQ(g->position(), st.position);
      GdnCheckpoint cp;
      cp.conv.assign(g->conv(), g->conv() + g->conv_size());
      cp.ssm.assign(g->ssm(), g->ssm() + g->ssm_size());
      snap.gdn.emplace_back(il, std::move(cp));
    }
  }
  if (st.mtp_kv) {
    snap.mtp_rows = st.mtp_kv->rows_committed();
    snap.mtp_kv = st.mtp_kv->Prefix(snap.mtp_rows);
  }
  return snap;
}

// Checks everything before touching the slot, then builds its state aside and swaps it in: a
// snapshot that does not fit leaves the slot as it was.
Status CpuStageSession::RestoreSlot(int s, const StageSlotSnapshot& snap) {
  if (s < 0 || s >= max_slots_) return Bad("slot " + std::to_string(s) + " does not exist");
  if (slots_[U(s)] && (slots_[U(s)]->position != 0 || slots_[U(s)]->pending_rows != 0))
    return Status::Runtime("slot restore", "slot " + std::to_string(s) + " is not fresh");
  auto fresh = NewSlot();
  std::size_t ik = 0, ig = 0;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const std::size_t l = U(il - layer_begin());
    const std::string where = "stage " + std::to_string(index()) + " layer " + std::to_string(il);
    if (KvCache* kv = fresh->kv[l].get()) {
      if (ik >= snap.kv.size() || snap.kv[ik].first != il || !snap.kv[ik].second)
        return Bad(where + ": no K/V rows");
      const KvPrefix& pre = *snap.kv[ik].second;
      if (!kv->Fits(pre) || pre.rows != snap.position)
        return Bad(where + ": K/V rows do not fit (rows " + std::to_string(pre.rows) +
                   ", position " + std::to_string(snap.position) + ")");
      ++ik;
    } else if (GdnState* g = fresh->gdn[l].get()) {
      if (ig >= snap.gdn.size() || snap.gdn[ig].first != il) return Bad(where + ": no GDN state");
      const GdnCheckpoint& cp = snap.gdn[ig].second;
      if (cp.conv.size() != g->conv_size() || cp.ssm.size() != g->ssm_size())
        return Bad(where + ": GDN state sizes do not fit");
      ++ig;
    }
  }
  if (ik != snap.kv.size() || ig != snap.gdn.size())
    return Bad("stage " + std::to_string(index()) + ": layers the stage does not hold");
  if (snap.mtp_kv &&
      (!fresh->mtp_kv || !fresh->mtp_kv->Fits(*snap.mtp_kv) || snap.mtp_kv->rows != snap.mtp_rows))
    return Bad("stage " + std::to_string(index()) + ": MTP draft K/V does not fit");
  ik = ig = 0;
  for (int il = layer_begin(); il < layer_end(); ++il) {
    const std::size_t l = U(il - layer_begin());
    if (KvCache* kv = fresh->kv[l].get()) kv->AdoptPrefix(snap.kv[ik++].second);
    if (GdnState* g = fresh->gdn[l].get()) {
      const GdnCheckpoint& cp = snap.gdn[ig++].second;
      g->Restore(cp.conv.data(), cp.ssm.data(), snap.position);
      // The window scratch the request already reserved (generate's ReserveWindowScratch).
      if (slots_[U(s)]) g->SwapScratch(*slots_[U(s)]->gdn[l]);
    }
  }
  if (snap.mtp_kv) fresh->mtp_kv->AdoptPrefix(snap.mtp_kv);
  fresh->position = snap.position;
  slots_[U(s)] = std::move(fresh);
  if (s == cur_index_) cur_ = slots_[U(s)].get();
  return Status::Ok();
}

}  // namespace lockstep
