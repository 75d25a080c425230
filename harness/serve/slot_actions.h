// POST /slots/{id}?action=save|restore|erase, as llama-server answers it, on lockstep's slot
// files (engine/include/lockstep/engine/slot_file.h, `lockstep.slot` v1):
//
//   save     body {"filename": NAME}: the conversation kept in slot id (a finished request sent
//            with "lockstep": {"keep": true}) written atomically to --slot-dir/NAME; the slot
//            keeps it. {"id_slot", "filename", "n_saved" (tokens), "n_written" (bytes),
//            "timings": {"save_ms"}}.
//   restore  body {"filename": NAME}: the file read and verified whole (digest, every section,
//            the model and engine options) before anything changes, then installed into slot
//            id, which must be free, as a kept conversation. {"id_slot", "filename",
//            "n_restored", "n_read", "timings": {"restore_ms"}}. A completion with
//            "id_slot": id and the conversation's tokens followed by new ones continues it
//            bitwise as if it had never left its slot.
//   preempt  the request running in slot id is preempted (lockstep/engine/scheduler.h,
//            "Preemption"): its slot is freed at once and the request resumes by recompute when
//            a slot is free again, its stream pausing meanwhile; its tokens are unchanged (with
//            batch_invariant on, bitwise its unpreempted run). No body. {"id_slot",
//            "preempted" (the request id), "n_tokens"}; 409 when the slot runs no request
//            ("slot_idle") or the request cannot be preempted ("not_preemptible").
//   erase    frees slot id's kept conversation: {"id_slot", "n_erased"} (0 when it held none).
//            The driver releases kept conversations the same way by itself (evicted for a new
//            request, idle, over --keep-max: engine_driver.h); a continuation of one gets 409
//            naming why.
//
// NAME: 1 to 128 of [A-Za-z0-9._-], not starting with '.': never a path. Refusals (OpenAI-shaped
// bodies): 400 an unknown action, a bad body or name, a slot id out of range, a file that is not
// a sound slot file or does not fit this engine (the message names the part: "slot file section
// 'layer.3.k': ..."); 404 no such file; 409 the slot is busy with a request, holds no kept
// conversation (save) or is not free (restore); 501 save or restore on a server without
// --slot-dir. Every refusal leaves the engine as it was and the server serving.
#pragma once

#include <string>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lockstep {

struct ServeContext;

void HandleSlotAction(ServeContext& ctx, const httplib::Request& req, httplib::Response& res);

// True for a slot file name the server accepts (see above).
bool PlainFileName(const std::string& name);

}  // namespace lockstep
