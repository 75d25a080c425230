#include "serve/prefix_hooks.h"

#include <vector>

namespace lockstep {

Status PrefixAdmit(PrefixCache& cache, Engine& engine, Sequence& seq, PrefixReport* report) {
  report->reused_tokens = 0;
  report->snapshot_position = -1;
  report->prefill_computed = 0;  // the scheduler counts the chunks it runs
  if (seq.prefill_begin() != 0) return Status::Ok();
  const std::vector<std::int32_t>& tokens = seq.tokens();
  const PrefixEntry* hit = cache.Lookup(tokens, seq.has_mtp());
  if (hit != nullptr) {
    const int s = hit->position();
    engine.UseSlot(seq.slot());
    std::vector<Injection> injections = engine.injections();
    LOCKSTEP_RETURN_IF_ERROR(engine.OpenSlotFrom(seq.slot(), hit->snap, std::move(injections)));
    engine.UseSlot(seq.slot());
    seq.ResumeAt(s, seq.has_mtp() ? &hit->mtp : nullptr);
    report->reused_tokens = s;
    report->snapshot_position = s;
  }
  const ReuseExplanation why = cache.Explain(tokens, seq.has_mtp(), report->reused_tokens);
  report->reason = why.reason;
  report->reason_at = why.at;
  cache.Trim();
  return Status::Ok();
}

Status PrefixCapture(PrefixCache& cache, Engine& engine, const Sequence& seq, int chunk_end) {
  if (seq.prefill_begin() != 0) return Status::Ok();
  const std::vector<std::int32_t>& tokens = seq.tokens();
  if (chunk_end > seq.prefill_end() || !cache.Wants(chunk_end, tokens, seq.has_mtp()))
    return Status::Ok();
  LOCKSTEP_ASSIGN_OR_RETURN(Engine::SlotSnapshot snap, engine.SnapshotSlot(seq.slot()));
  if (snap.position != chunk_end)
    return Status::Runtime("prefix cache", "slot " + std::to_string(seq.slot()) + " is at " +
                                               std::to_string(snap.position) + ", the chunk at " +
                                               std::to_string(chunk_end));
  PrefixEntry entry;
  entry.tokens.assign(tokens.begin(), tokens.begin() + chunk_end + 1);
  entry.source = std::make_shared<const std::vector<std::int32_t>>(tokens);  // the prompt
  entry.uses_mtp = seq.has_mtp();
  entry.snap = std::move(snap);
  if (seq.has_mtp()) entry.mtp = seq.SaveMtp();
  cache.Insert(std::move(entry));
  return Status::Ok();
}

}  // namespace lockstep
