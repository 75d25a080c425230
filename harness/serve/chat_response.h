// The chat shape of an answer (POST /v1/chat/completions), made from the completion's JSON so
// both endpoints carry the same usage, finish_reason and `lockstep` object: object
// "chat.completion" with choices[].message {role "assistant", content}, or, streamed,
// "chat.completion.chunk" with choices[].delta ({role, content} while text comes, {} on the
// chunk with finish_reason). The text field is dropped; everything else stays.
#pragma once

#include <nlohmann/json.hpp>

namespace lockstep {

nlohmann::json ToChatJson(nlohmann::json completion, bool chunk);

}  // namespace lockstep
