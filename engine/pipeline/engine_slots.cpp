// Engine slot snapshots (engine.h): every stage's StageSlotSnapshot of one slot, and opening a
// slot from one (all or nothing).
#include <string>

#include "lockstep/engine/engine.h"

namespace lockstep {

std::size_t StageSlotSnapshot::bytes() const {
  std::size_t n = 0;
  for (const auto& [il, pre] : kv) n += pre ? pre->bytes() : 0;
  for (const auto& [il, cp] : gdn) n += (cp.conv.size() + cp.ssm.size()) * sizeof(float);
  if (mtp_kv) n += mtp_kv->bytes();
  return n;
}

std::size_t Engine::SlotSnapshot::bytes() const {
  std::size_t n = 0;
  for (const StageSlotSnapshot& s : stages) n += s.bytes();
  return n;
}

Result<Engine::SlotSnapshot> Engine::SnapshotSlot(int s) {
  if (s < 0 || s >= max_slots())
    return Status::InvalidArgument(
        "slot", std::to_string(s) + " outside 0.." + std::to_string(max_slots() - 1));
  const Slot& sl = slot_state(s);
  const std::string who = "slot " + std::to_string(s);
  if (!sl.open) return Status::Runtime("slot snapshot", who + " is not open");
  if (sl.pending != 0)
    return Status::Runtime("slot snapshot", who + " has an uncommitted verify window");
  SlotSnapshot snap;
  snap.position = sl.position;
  for (auto& st : stages_) {
    LOCKSTEP_ASSIGN_OR_RETURN(StageSlotSnapshot ss, st->SnapshotSlot(s));
    if (ss.position != sl.position)
      return Status::Runtime("slot snapshot", who + ": stage " + std::to_string(st->index()) +
                                                  " is at " + std::to_string(ss.position) +
                                                  ", the slot at " + std::to_string(sl.position));
    snap.stages.push_back(std::move(ss));
  }
  return snap;
}

Status Engine::OpenSlotFrom(int s, const SlotSnapshot& snap, std::vector<Injection> injections) {
  if (snap.stages.size() != stages_.size())
    return Status::InvalidArgument("slot snapshot", std::to_string(snap.stages.size()) +
                                                        " stages for an engine of " +
                                                        std::to_string(stages_.size()));
  for (const StageSlotSnapshot& ss : snap.stages)
    if (ss.position != snap.position)
      return Status::InvalidArgument("slot snapshot", "stages at different positions");
  // A prefix-cache hit reopens the admitted request's own slot: its grafts stay with it.
  std::vector<Graft> grafts = std::move(slot_state(s).grafts);
  std::vector<GraftRecord> graft_records = std::move(slot_state(s).graft_records);
  LOCKSTEP_RETURN_IF_ERROR(OpenSlot(s, std::move(injections)));
  Slot& sl = slot_state(s);
  sl.grafts = std::move(grafts);
  sl.graft_records = std::move(graft_records);
  for (std::size_t is = 0; is < stages_.size(); ++is) {
    Status st = stages_[is]->RestoreSlot(s, snap.stages[is]);
    if (!st.ok()) {
      sl.used = true;  // earlier stages hold the snapshot's rows: CloseSlot resets them all
      CloseSlot(s);
      return st;
    }
  }
  sl.used = true;
  sl.position = snap.position;
  return Status::Ok();
}

}  // namespace lockstep
