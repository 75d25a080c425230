// Sequence: one request's decode loop, cut into the phases a scheduler calls (engine/serve).
// It is the old single-request Decoder (generate.cpp) with the engine calls taken out: the
// scheduler puts the sequence's prefill chunks and verify windows into engine steps and hands
// back each group's slice of the step's outputs.
//
// Per request, in order:
//   Setup()                        prompt and option checks, --replay-path, the drafters
//   OnAdmit()                      its slot is open: window scratch, the prefill clock
//   while prefilling():            NextChunk() -> the scheduler runs it -> OnPrefillChunk()
//   until done():                  StopRequested()? else BeginWindow() -> window_tokens() ->
//                                  the scheduler runs the verify -> OnVerified()
//   TakeResult()
// Prefill covers positions [prefill_begin, n-1) of the n tokens known (the prompt; a
// continuation adds tokens), cut on the absolute grid of prefill_chunk; the first window is at
// n-1 with the last token. Every call that touches the engine selects the sequence's slot first
// (Engine::UseSlot), so checkpoints, drafts and commits act on this request's state only.
//
// Borrowed: the engine and the hooks outlive the sequence. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "decode/draft_policy.h"
#include "decode/mtp_drafter.h"
#include "decode/suffix_index.h"
#include "lockstep/engine/conversation.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/generate.h"
#include "lockstep/engine/request_options.h"

namespace lockstep {

// The engine step a window or chunk ran in (the window record's context fields).
struct StepContext {
  std::int64_t step = -1;
  int rows = 0, seqs = 0, prefill_rows = 0;
  std::int64_t begin_ns = 0, end_ns = 0;  // around RunStep
};

class Sequence {
 public:
  Sequence(Engine& engine, int slot, std::vector<std::int32_t> prompt, RequestOptions opts,
           const GenerateHooks* hooks);

  // Checks the prompt against the vocabulary and the options (policy, replay file) and makes
  // the drafters. Touches no engine state. kInvalidArgument with the old Generate messages.
  Status Setup();
  int slot() const { return slot_; }
  void set_slot(int s) { slot_ = s; }
  const RequestOptions& options() const { return opts_; }
  // The largest verify window this request can ask for.
  int MaxWindow() const;
  // Tokens at absolute positions: prompt + output so far (+ a continuation's tokens).
  const std::vector<std::int32_t>& tokens() const { return tokens_; }

  // Its slot is open (and selected): grows the window scratch, starts the prefill clock; a
  // sequence with nothing to prefill goes straight to decoding.
  void OnAdmit();
  // Prefix cache: the slot already holds the state of positions [0, p) (p on the snapshot grid,
  // <= the prefill end); prefill resumes at p. `mtp`: the drafter's state at p (null without
  // MTP). Call after OnAdmit, before the first chunk.
  void ResumeAt(int p, const MtpDrafterState* mtp);

  // ---- prefill ----
  bool prefilling() const { return next_ < prefill_end_; }
  int prefill_begin() const { return prefill_begin_; }
  int prefill_next() const { return next_; }
  int prefill_end() const { return prefill_end_; }
  // The next chunk [p, p+T) on the absolute grid: T = min(next multiple of prefill_chunk above
  // p, prefill end) - p.
  int NextChunkRows() const;
  std::span<const std::int32_t> ChunkTokens(int p, int T) const;
  // After the engine ran chunk [p, p+T) (committed): MTP draft K/V for its rows, on_prefill
  // progress; the last chunk ends prefill (suffix index, decode clock).
  Status OnPrefillChunk(int p, int T, const float* normed);

  // ---- decode ----
  bool done() const { return done_; }
  int windows_run() const { return idx_; }  // windows of this request so far
  // hooks->stop_check: true, with the stop reason set, when the request should end here.
  bool StopRequested();
  // BeginWindow + Draft + the pre_verify checkpoint; window_tokens() is then the window.
  Status BeginWindow();
  int window_p() const { return w_.rec.p; }
  std::span<const std::int32_t> window_tokens() const { return window_tokens_; }
  // After the step: logits f32 [T, V] and normed f32 [T, H] of this window's rows. The
  // post_verify checkpoint, acceptance, Commit, the commit checkpoint, the drafters, the record.
  Status OnVerified(const float* logits, const float* normed, const StepContext& step);

  // The result so far (output, windows, timings); leaves the sequence ready for Continue.
  GenerateResult TakeResult();

  // ---- conversations ----
  // A new request on the same conversation: `more` tokens (at least one) after the current
  // token; prefill [cur] + more[0, n-1) from the committed position, first window at
  // more.back(). kInvalidArgument for options the conversation cannot change (MTP on/off).
  Status Continue(std::vector<std::int32_t> more, RequestOptions opts, const GenerateHooks* hooks);
  // The drafter and decoder state between windows (no window in flight).
  bool has_mtp() const { return mtp_ != nullptr; }
  MtpDrafterState SaveMtp() const;
  DecoderState SaveDecoder() const;
  // A sequence made by Setup() on `state.tokens` takes the kept state (its slot already holds
  // state.slot); it is then done, ready for Continue.
  Status Restore(const ConversationState& state);

  // ---- preemption (engine/serve/preempt.cpp; sequence_recompute.cpp) ----
  // Its slot is about to be freed between two steps (no window in flight): remembers how far
  // prefill got and how many windows ran, the part a resumption recomputes (mid-recompute: the
  // earlier preemption's, unchanged).
  void OnPreempt();
  // Its slot is open again, selected and at committed position `from` (0, a prefix-cache
  // snapshot on the prefill grid, or a slot file at the preemption point); `mtp` the drafter's
  // state there (null: a fresh drafter, from = 0). Recompute then runs, invisible to the hooks:
  // prefill chunks up to where prefill had got, then every window run so far, replayed.
  // kInvalidArgument when `from` is past the preemption point or inside the windows.
  Status BeginRecompute(int from, const MtpDrafterState* mtp);
  bool recomputing() const { return next_ < recompute_until_ || replaying(); }
  // The point the last OnPreempt recorded: committed positions, prefill done, windows run.
  int preempt_position() const { return preempt_position_; }
  bool preempted_decoding() const { return preempt_next_ >= prefill_end_; }
  int preempt_windows() const { return replay_end_; }
  // Decoding with recorded windows left to replay (before any new window).
  bool replaying() const { return !prefilling() && replay_k_ < replay_end_; }
  // The next recorded window as window_tokens() / window_p(): its tokens (cur + draft), the MTP
  // extension its draft had made. Then, after the step, OnReplayed: commit of its accepted + 1
  // rows and the MTP rows; `*diverged` when the logits do not give its emitted tokens again.
  Status BeginReplayWindow();
  bool in_replay_window() const { return in_replay_; }
  Status OnReplayed(const float* logits, const float* normed, bool* diverged);
  // Committed rows of the windows replayed so far (the recompute's decode share).
  int replayed_rows() const { return replayed_rows_; }

 private:
  // One window in flight: its record and what one phase hands the next.
  struct Window {
    WindowRecord rec;
    Observer* obs = nullptr;     // hooks->observer, read once per window; may be null
    std::int64_t export_ns = 0;  // the checkpoints' time so far, measured apart from model work
    std::int64_t commit_export_ns = 0;  // the commit checkpoint's share of export_ns
    std::int64_t verify_end_ns = 0;     // after the post-verify checkpoint
  };
  bool IsEos(std::int32_t t) const;
  void EndPrefill();
  void EndRecompute();    // recompute is over: the op observer is the hooks' again
  void ReserveScratch();  // the GDN window scratch of its slot for MaxWindow()
  Status MakeDrafters();
  Status Draft();
  Status DraftFromReplay(std::vector<std::int32_t>& draft);
  void ProposeDraft(int room, std::vector<std::int32_t>& draft);
  std::int64_t Checkpoint(CheckpointPoint point, const float* logits);
  Status AcceptAndCommit(const float* logits);
  Status Advance(const float* normed);
  Status EndWindow();

  Engine& engine_;
  int slot_;
  const ModelConfig& mc_;
  std::vector<std::int32_t> tokens_;
  RequestOptions opts_;
  const GenerateHooks* hooks_;

  std::vector<WindowRecord> replay_;  // --replay-path's windows; empty = draft live
  bool speculative_ = false;
  std::unique_ptr<DraftPolicy> policy_;
  std::unique_ptr<SuffixIndex> suffix_;  // null without suffix drafts
  std::unique_ptr<MtpDrafter> mtp_;      // null without MTP drafts
  std::size_t suffix_len_ = 0;           // tokens appended to the suffix index

  int prefill_begin_ = 0, next_ = 0, prefill_end_ = 0;
  bool done_ = false;
  bool admitted_ = false;  // OnAdmit ran: the drafters have seen rows
  GenerateResult res_;
  std::int64_t admit_ns_ = 0;         // OnAdmit / Continue
  std::int64_t decode_begin_ns_ = 0;  // end of prefill
  Window w_;
  int idx_ = 0;                   // the next window's index in this request
  int windows_total_ = 0;         // windows over the whole conversation
  std::vector<int> scratch_;      // SampleToken's
  std::vector<float> penalized_;  // f32 [n_vocab]: a row's logits after ApplyPenalties
  std::vector<std::int32_t> window_tokens_;
  std::int32_t cur_ = 0;        // the token the next window starts with
  int streak_ = 0;              // preceding windows that accepted all of their drafts
  bool prefill_ended_ = false;  // EndPrefill ran for this request
  // Preemption: the MTP committed rows after each window's draft (replay extends the same).
  std::vector<int> mtp_rows_after_draft_;
  int preempt_next_ = 0;               // prefill progress when preempted
  int preempt_position_ = 0;           // committed positions when preempted
  int recompute_until_ = 0;            // prefill rows below this are recomputed (hooks silent)
  int replay_k_ = 0, replay_end_ = 0;  // windows [replay_k_, replay_end_) still to replay
  int replayed_rows_ = 0;
  bool in_replay_ = false;
};

}  // namespace lockstep
