// Scheduler conversations out of and into slots (scheduler.h ExportConversation /
// ImportConversation): the slot's engine snapshot (Engine::SnapshotSlot, K/V pages shared) plus
// the sequence's drafter and decoder state, and back.
//
// Import checks everything it can before it touches the engine (a free slot, the reservation, the
// options and drafter state against a sequence made from the state's tokens), so that the only
// engine call, Engine::OpenSlotFrom, is the last thing that can fail, and it is all or nothing.
#include <string>

#include "decode/draft_policy.h"
#include "serve/memory.h"
#include "serve/scheduler.h"

namespace lockstep {

Result<ConversationState> Scheduler::ExportConversation(Ticket t) {
  Entry* e = FindLive(t);
  if (e == nullptr || !e->kept)
    return Status::InvalidArgument("export", "no kept conversation " + std::to_string(t));
  const Sequence& seq = *e->seq;
  ConversationState st;
  st.id = e->spec.id;
  st.tokens = seq.tokens();
  LOCKSTEP_ASSIGN_OR_RETURN(st.slot, engine_.SnapshotSlot(e->res.slot));
  st.has_mtp = seq.has_mtp();
  if (st.has_mtp) st.mtp = seq.SaveMtp();
  st.decoder = seq.SaveDecoder();
  st.options = seq.options();
  return st;
}

namespace {

// The drafter state's sizes, which MtpDrafter::LoadState takes for granted.
Status CheckDrafterState(const ConversationState& s, const ModelConfig& c) {
  const auto H = static_cast<std::size_t>(c.n_embd), V = static_cast<std::size_t>(c.n_vocab);
  const MtpDrafterState& m = s.mtp;
  if (m.last_m.size() != H || m.last_logits.size() != V ||
      m.pending_h.size() != m.pending_tokens.size() * H ||
      m.next_row != m.pending_p + static_cast<int>(m.pending_tokens.size()) ||
      m.next_row != s.slot.position || m.pending_p != s.slot.stages.back().mtp_rows)
    return Status::InvalidArgument("import conversation",
                                   "MTP drafter state does not fit this model");
  return Status::Ok();
}

}  // namespace

Result<Ticket> Scheduler::ImportConversation(const ConversationState& state, int want) {
  const std::string what = "import conversation";
  if (state.tokens.empty() || state.slot.position != static_cast<int>(state.tokens.size()) - 1)
    return Status::InvalidArgument(what, "the snapshot is not at the conversation's last token");
  const bool wanted_free = want >= 0 && want < n_slots_ && !live_[static_cast<std::size_t>(want)];
  const int slot = want < 0 ? FreeSlot() : wanted_free ? want : -1;
  if (slot < 0) return Status::Runtime(what, want < 0 ? "no free slot" : "the slot is not free");
  RequestSpec spec;
  spec.id = state.id;
  spec.prompt = state.tokens;
  spec.options = state.options;
  spec.keep = true;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Entry> e, MakeEntry(std::move(spec), next_ticket_));
  const std::uint64_t limit = MemoryLimitBytes(engine_.config());
  if (limit > 0 && counters_.reserved_bytes + e->reserved > limit)
    return Status::Runtime(what, "its reservation does not fit --memory-mib now");
  if (state.has_mtp != e->seq->has_mtp())
    return Status::InvalidArgument(what, "MTP drafter state does not match its options");
  if (state.has_mtp) LOCKSTEP_RETURN_IF_ERROR(CheckDrafterState(state, engine_.weights().config));
  auto policy = DraftPolicy::Create(state.options.draft_policy);  // MakeEntry checked the name
  if (!policy || !policy->LoadState(state.decoder.policy_state).ok())
    return Status::InvalidArgument(
        what, "the draft policy state is not one of '" + state.options.draft_policy + "'");
  // The engine's part, all or nothing; the sequence's part cannot fail after the checks above.
  LOCKSTEP_RETURN_IF_ERROR(engine_.OpenSlotFrom(slot, state.slot, e->injections));
  ++next_ticket_;
  ++counters_.submitted;
  ++counters_.admitted;
  e->res.slot = slot;
  e->res.arrive_step = e->res.admit_step = step_;
  e->admit_order = admit_seq_++;
  e->seq->set_slot(slot);
  e->seq->OnAdmit();
  Status restored = e->seq->Restore(state);
  if (!restored.ok()) {
    engine_.CloseSlot(slot);
    return restored;
  }
  e->kept = e->res.kept = true;
  counters_.reserved_bytes += e->reserved;
  const Ticket t = e->res.ticket;
  live_[static_cast<std::size_t>(slot)] = std::move(e);
  Count();
  return t;
}

}  // namespace lockstep
