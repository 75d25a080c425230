// The tokenizer of a Hugging Face `tokenizer.json` with a byte-level BPE model, as Qwen's
// checkpoints ship it: NFC normaliser, the Split pre-tokenizer with Qwen's regex (Isolated), the
// byte-level pre-tokenizer and decoder, ranked merges, and added tokens matched (leftmost-longest,
// on the raw text) before normalisation and pre-tokenization. The ids equal those of Hugging
// Face's tokenizers (tests/tokenizer/README.md says how that is tested and what differs).
//
// Supported exactly, everything else refused with kNotSupported naming the field and its value
// (never a silent fallback to bytes):
//   normalizer      null | {"type": "NFC"}
//   pre_tokenizer   Sequence[Split(Qwen's pattern, Isolated, invert false),
//                            ByteLevel(add_prefix_space false, use_regex false)]
//   model           BPE with dropout, unk_token, continuing_subword_prefix, end_of_word_suffix
//                   null or empty, fuse_unk, byte_fallback and ignore_merges false; merges as
//                   "a b" strings or [a, b] pairs; every byte's character in the vocabulary
//   decoder         ByteLevel;  post_processor null | ByteLevel;  truncation, padding null
//   added_tokens    single_word, lstrip, rstrip and normalized false
// Unicode classes (\p{L}, \p{N}, \s) and NFC come from ICU (libicu), not tables of our own.
//
// The same tokenizer is read from a GGUF file's tokenizer.ggml.* metadata (llama.cpp's keys, as
// its converter writes a Qwen tokenizer.json: model "gpt2", pre "qwen2"; the key table is in
// engine/model/bpe_gguf.cpp) and written there by ConvertToGguf (gguf.h).
#pragma once

#include <string>
#include <string_view>

#include "lockstep/engine/status.h"
#include "lockstep/engine/tokenizer.h"

namespace lockstep {

// Reads and parses `path` (at most 256 MiB). kNotFound / kIOError for the file, kCorruption for
// JSON that is not a consistent tokenizer (a merge of tokens not in the vocabulary, duplicate
// ids), kNotSupported for a type or option outside the list above.
Result<TokenizerPtr> LoadBpeTokenizer(const std::string& path);

// The same from the file's text; `label` names it in messages. info().path is `label`.
Result<TokenizerPtr> ParseBpeTokenizer(std::string_view json, const std::string& label);

class GgufFile;

// The vocabulary `file` declares in its tokenizer.ggml.* metadata; a null pointer (and no error)
// when it declares none (no tokenizer.ggml.model, or "none"). kNotSupported names an unsupported
// tokenizer.ggml.model, tokenizer.ggml.pre, token type or option; kCorruption names the key (and
// the entry) of a missing or malformed value. info().path is the file's path.
Result<TokenizerPtr> LoadGgufTokenizer(const GgufFile& file);

// Qwen's pre-tokenizer pattern (the only Split pattern supported), as tokenizer.json writes it.
extern const char* const kQwenSplitPattern;

}  // namespace lockstep
