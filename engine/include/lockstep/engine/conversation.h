// ConversationState: everything a finished request kept as a conversation (Scheduler, keep =
// true) needs to continue bitwise as if it had never left its slot: the tokens so far, the
// slot's engine state, the MTP drafter's queue and last row, the decoder's and the draft
// policy's state, and the request's options. Scheduler::ExportConversation fills it;
// ImportConversation puts it into a free slot; the slot file (engine/serve/slot_file.h) writes
// and verifies it.
//
// The suffix index is not stored: it is a function of `tokens` and is rebuilt from them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/engine/engine.h"
#include "lockstep/engine/request_options.h"

namespace lockstep {

// decode/mtp_drafter.h's state between two windows.
struct MtpDrafterState {
  int next_row = 0;                          // first row not yet queued
  int pending_p = 0;                         // position of the first pending row
  std::vector<float> pending_h;              // f32 [n, H] queued final-normed hidden
  std::vector<std::int32_t> pending_tokens;  // [n] their next tokens
  std::vector<float> last_m;                 // f32 [H] the last extended row's m
  std::vector<float> last_logits;            // f32 [V] and its logits (draft 1)
};

// The decode loop's state between two windows.
struct DecoderState {
  std::int32_t cur = 0;      // the token the next window starts with (not yet in K/V)
  int streak = 0;            // preceding windows that accepted all of their drafts
  std::string policy_state;  // DraftPolicy::SaveState() bytes (empty for static)
  int windows = 0;           // windows run so far over the whole conversation
};

struct ConversationState {
  std::string id;                    // the request id it was kept under
  std::vector<std::int32_t> tokens;  // prompt + every output token so far (absolute positions)
  Engine::SlotSnapshot slot;         // committed state: position == tokens.size() - 1
  bool has_mtp = false;              // the MTP drafter was on (mtp below is meaningful)
  MtpDrafterState mtp;
  DecoderState decoder;
  RequestOptions options;  // the options of the request that produced it
};

}  // namespace lockstep
