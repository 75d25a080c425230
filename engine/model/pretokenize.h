// Qwen's Split pre-tokenizer, private to the BPE tokenizer: the pieces Hugging Face's
// tokenizers cut valid UTF-8 text into with the pattern (Oniguruma, behaviour Isolated)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// written as a matcher over character classes: every position matches one alternative, so the
// pieces cover the text. \p{L} and \p{N} are Unicode general categories L* and N*, \s is the
// White_Space property, all looked up in ICU.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace lockstep {

// Appends the end offset (in bytes) of every piece of `text` to `ends`, in order; the last one is
// text.size(). `text` must be valid UTF-8 (the caller checks).
void QwenSplit(std::string_view text, std::vector<std::uint32_t>& ends);

}  // namespace lockstep
