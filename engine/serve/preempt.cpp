// Preemption in the scheduler (lockstep/engine/scheduler.h, "Preemption"): freeing a running
// request's slot, the priority / memory triggers, the test hook, and the resumption (a slot file,
// a prefix-cache snapshot or position 0, then Sequence::BeginRecompute).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "lockstep/engine/slot_file.h"
#include "serve/memory.h"
#include "serve/scheduler.h"

namespace lockstep {

const char* PreemptReasonName(PreemptReason r) {
  switch (r) {
    case PreemptReason::kMemory:
      return "memory";
    case PreemptReason::kPriority:
      return "priority";
    case PreemptReason::kRequest:
      return "request";
    case PreemptReason::kTest:
      return "test";
  }
  return "?";
}

const char* ResumeFromName(ResumeFrom r) {
  switch (r) {
    case ResumeFrom::kSnapshot:
      return "snapshot";
    case ResumeFrom::kSlotFile:
      return "slot_file";
    case ResumeFrom::kScratch:
      return "scratch";
  }
  return "?";
}

std::string PreemptionsJson(const std::vector<PreemptionRecord>& records) {
  nlohmann::json a = nlohmann::json::array();
  for (const PreemptionRecord& r : records)
    a.push_back({{"reason", PreemptReasonName(r.reason)},
                 {"step", r.step},
                 {"phase", r.decode ? "decode" : "prefill"},
                 {"position", r.position},
                 {"window", r.window},
                 {"resume_step", r.resume_step},
                 {"resume_slot", r.resume_slot},
                 {"resumed_from", ResumeFromName(r.from)},
                 {"from_position", r.from_position},
                 {"tokens_recomputed", r.tokens_recomputed},
                 {"windows_replayed", r.windows_replayed},
                 {"windows_diverged", r.windows_diverged}});
  return a.dump();
}

Ticket Scheduler::RunningIn(int slot) const {
  if (slot < 0 || slot >= n_slots_) return 0;
  const Entry* e = live_[static_cast<std::size_t>(slot)].get();
  return e != nullptr && !e->kept ? e->res.ticket : 0;
}

namespace {

// Why `e` cannot be preempted ("" when it can).
std::string NotPreemptible(Engine& engine, const Sequence& seq, bool slot_files) {
  engine.UseSlot(seq.slot());
  if (!engine.injections().empty())
    return "it has --inject faults (their firings are not replayed)";
  if (!engine.grafts().empty()) return "it has grafts (their firings are not replayed)";
  if (seq.prefill_begin() > 0 && !slot_files)
    return "a continuation's state holds rows of earlier requests' windows (needs slot files)";
  return "";
}

}  // namespace

Status Scheduler::Preempt(Ticket t, PreemptReason why) {
  Entry* e = FindLive(t);
  if (e == nullptr || e->kept)
    return Status::InvalidArgument("preempt", "no running request " + std::to_string(t));
  return PreemptNow(*e, why, 0);
}

Status Scheduler::PreemptNow(Entry& e, PreemptReason why, int hold_steps) {
  const std::string no = NotPreemptible(engine_, *e.seq, !opts_.preempt_slot_dir.empty());
  if (!no.empty()) return Status::InvalidArgument("preempt", "request '" + e.spec.id + "': " + no);
  const int slot = e.res.slot;
  Sequence& seq = *e.seq;
  PreemptionRecord rec;
  rec.reason = why;
  rec.step = step_;
  const bool recomputing = seq.recomputing();  // mid-recompute: no slot file (recompute again)
  seq.OnPreempt();  // selects its slot; mid-recompute it keeps the earlier preemption's point
  rec.decode = seq.preempted_decoding();
  rec.position = seq.preempt_position();
  rec.window = rec.decode ? seq.preempt_windows() : -1;
  if (!opts_.preempt_slot_dir.empty() && !recomputing) {
    ConversationState cs;
    cs.id = e.spec.id;
    cs.tokens.assign(seq.tokens().begin(), seq.tokens().begin() + rec.position + 1);
    LOCKSTEP_ASSIGN_OR_RETURN(cs.slot, engine_.SnapshotSlot(slot));
    cs.has_mtp = seq.has_mtp();
    if (cs.has_mtp) cs.mtp = seq.SaveMtp();
    // Nothing pending (prefill extends every chunk): the next pending row is next_row, as the
    // file's check wants (the drafter sets pending_p at its next Queue anyway).
    if (cs.mtp.pending_tokens.empty()) cs.mtp.pending_p = cs.mtp.next_row;
    cs.decoder = seq.SaveDecoder();
    cs.options = seq.options();
    const std::string path = opts_.preempt_slot_dir + "/preempt-" + std::to_string(e.res.ticket) +
                             "-" + std::to_string(e.res.preemptions.size()) + ".slot";
    LOCKSTEP_RETURN_IF_ERROR(SaveConversation(path, engine_, cs));
    e.slot_file = path;
  }
  e.res.preemptions.push_back(rec);
  ++counters_.preempted;
  counters_.reserved_bytes -= e.reserved;
  engine_.CloseSlot(slot);
  std::unique_ptr<Entry> owned = std::move(live_[static_cast<std::size_t>(slot)]);
  owned->resume = true;
  if (prefix_cache_) prefix_cache_->Trim();
  if (hold_steps > 0) {
    owned->spec.arrive_step = step_ + hold_steps;
    future_.push_back(std::move(owned));
  } else {
    Enqueue(std::move(owned));
  }
  Count();
  return Status::Ok();
}

bool Scheduler::PreemptFor(const Entry& head) {
  const std::uint64_t limit = MemoryLimitBytes(engine_.config());
  const bool slot_short = FreeSlot() < 0;
  Entry* victim = nullptr;
  std::uint64_t freeable = 0;  // what preempting every candidate would free
  for (auto& e : live_) {
    if (!e || e->kept || e->spec.priority >= head.spec.priority) continue;
    if (!NotPreemptible(engine_, *e->seq, !opts_.preempt_slot_dir.empty()).empty()) continue;
    freeable += e->reserved;
    if (victim == nullptr || e->spec.priority < victim->spec.priority ||
        (e->spec.priority == victim->spec.priority && e->admit_order > victim->admit_order))
      victim = e.get();
  }
  if (victim == nullptr) return false;
  // Memory short: only when preempting could make room (else nothing is preempted for it).
  if (limit > 0 && counters_.reserved_bytes - freeable + head.reserved > limit) return false;
  return PreemptNow(*victim, slot_short ? PreemptReason::kPriority : PreemptReason::kMemory, 0)
      .ok();
}

void Scheduler::PreemptAtHook(Entry& e, bool decode) {
  const int done = decode ? e.seq->windows_run() - 1 : e.chunks_run - 1;
  for (const PreemptAt& at : e.spec.preempt_at)
    if (at.decode == decode && at.index == done) {
      (void)PreemptNow(e, PreemptReason::kTest, at.hold_steps);  // refused: it keeps running
      return;
    }
}

Status Scheduler::ResumeInto(Entry& e, int slot) {
  e.res.slot = slot;
  e.admit_order = admit_seq_++;
  e.seq->set_slot(slot);
  e.resume = false;
  PreemptionRecord& rec = e.res.preemptions.back();
  rec.resume_step = step_;
  rec.resume_slot = slot;
  ++counters_.resumed;
  ConversationState file;
  const MtpDrafterState* mtp = nullptr;
  const PrefixEntry* hit = nullptr;
  if (!e.slot_file.empty()) {
    auto loaded = LoadConversation(e.slot_file, engine_);
    std::remove(e.slot_file.c_str());
    e.slot_file.clear();
    if (!loaded.ok()) return loaded.status();
    file = std::move(loaded).value();
    LOCKSTEP_RETURN_IF_ERROR(engine_.OpenSlotFrom(slot, file.slot, e.injections));
    rec.from = ResumeFrom::kSlotFile;
    rec.from_position = file.slot.position;
    if (file.has_mtp) mtp = &file.mtp;
  } else if (prefix_cache_ && e.spec.use_prefix_cache && e.seq->prefill_begin() == 0 &&
             (hit = prefix_cache_->Lookup(e.spec.prompt, e.seq->has_mtp())) != nullptr &&
             (rec.decode || hit->position() <= rec.position)) {
    LOCKSTEP_RETURN_IF_ERROR(engine_.OpenSlotFrom(slot, hit->snap, e.injections));
    rec.from = ResumeFrom::kSnapshot;
    rec.from_position = hit->position();
    if (e.seq->has_mtp()) mtp = &hit->mtp;
  } else {
    LOCKSTEP_RETURN_IF_ERROR(engine_.OpenSlot(slot, e.injections));
    rec.from = ResumeFrom::kScratch;
    rec.from_position = 0;
  }
  return e.seq->BeginRecompute(rec.from_position, mtp);
}

}  // namespace lockstep
