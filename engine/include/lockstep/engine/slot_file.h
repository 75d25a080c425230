// Slot files: a finished conversation (conversation.h ConversationState) saved to disk and read
// back, format `lockstep.slot` v1.
//
// Bytes (little-endian):
//   magic          16 bytes "LOCKSTEP-SLOT\0\0\0"
//   version        u32 (1)
//   header_len     u64
//   header         JSON, header_len bytes: schema, version, the model's digests, the engine
//                  options the state depends on (kv dtype, kv_page_rows, prefill_chunk, snapshot
//                  grid, stages and layer boundaries), n_tokens, position, mtp_rows, the request
//                  options and the section table [{name, offset, bytes, dtype, shape}] (offsets
//                  from the first section byte, sections contiguous in table order)
//   sections       tokens int32 [n]; per attention layer il: layer.il.k / layer.il.v raw stored
//   rows
//                  [position, Hkv, D] (+ layer.il.k_scales / v_scales f32 [position, Hkv] for
//                  int8); per GDN layer: layer.il.conv f32 [K-1, conv_dim], layer.il.ssm f32
//                  [Hv, Dk, Dv]; mtp.k / mtp.v (+ scales) [mtp_rows, Hkv, D]; the MTP drafter's
//                  mtp.index int32 [2] (next_row, pending_p), mtp.pending_h f32 [n, H],
//                  mtp.pending_tokens int32 [n], mtp.last_m f32 [H], mtp.last_logits f32
//                  [V]; decoder int32 [3] (cur, streak, windows), decoder.policy uint8 [n]
//   digest         SHA-256 of every byte before it (32 bytes)
//
// Save writes through AtomicFileWriter: a reader never sees a half-written file. Load checks,
// in this order, the size bound, the magic, the version and the digest (before reading the
// header), then parses the header strictly and checks every size and offset against the model
// and the engine's configuration; only then does it build the state. Errors name the part:
// kCorruption (a damaged or inconsistent file: "slot file section 'layer.3.k': ..."),
// kInvalidArgument (a sound file that does not fit this engine: another model, K/V dtype, page
// size, chunk or stage split), kNotFound / kIOError (reading). Load never touches the engine:
// the state it returns is built off to the side, and installing it (Scheduler::
// ImportConversation) is a separate step.
//
// Thread safety: free functions; an engine is only read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "lockstep/engine/conversation.h"
#include "lockstep/engine/engine.h"
#include "lockstep/engine/status.h"

namespace lockstep {

inline constexpr std::uint32_t kSlotFileVersion = 1;
inline constexpr char kSlotFileSchema[] = "lockstep.slot";
// Files larger than this are refused before they are read (kInvalidArgument).
inline constexpr std::uint64_t kSlotFileMaxBytes = std::uint64_t{16} << 30;

// The file's bytes for `state` (a conversation of `engine`'s model and configuration).
// kInvalidArgument when the state does not fit the engine (another layer count, K/V rows that
// disagree with the position).
Result<std::string> EncodeConversation(const Engine& engine, const ConversationState& state);
// Parses and verifies `bytes` (see the file comment for the order of the checks).
Result<ConversationState> DecodeConversation(std::string_view bytes, const Engine& engine);

// EncodeConversation written atomically to `path`.
Status SaveConversation(const std::string& path, const Engine& engine,
                        const ConversationState& state);
// Reads `path` (at most `max_bytes`) and DecodeConversation's it.
Result<ConversationState> LoadConversation(const std::string& path, const Engine& engine,
                                           std::uint64_t max_bytes = kSlotFileMaxBytes);

}  // namespace lockstep
