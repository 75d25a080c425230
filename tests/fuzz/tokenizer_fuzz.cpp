// libFuzzer target: arbitrary bytes -> the BPE tokenizer's Encode, then Decode.
//
// The contract under test (engine/include/lockstep/engine/bpe_tokenizer.h, tokenizer.h): input
// that is not valid UTF-8 is kInvalidArgument with a message; valid input encodes to ids that all
// have a token, and NFC(decode(encode(s))) == NFC(s) (the text between added tokens is NFC'd
// separately, so compare after one more NFC); the streaming decoder gives Decode's text when fed
// one id at a time; never a crash or out-of-bounds read. The tokenizer is the handwritten
// tests/tokenizer/data/tiny_tokenizer.json (LOCKSTEP_TINY_TOKENIZER: its path). Run e.g.
// `./tokenizer_fuzz -max_total_time=60 corpus/tokenizer`.
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "lockstep/engine/bpe_tokenizer.h"
#include "model/utf8.h"

namespace {

std::string Nfc(const std::string& s) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  nfc->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<std::int32_t>(s.size())), sink,
                     nullptr, err);
  if (U_FAILURE(err)) std::abort();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lockstep::TokenizerPtr tok = [] {
    auto t = lockstep::LoadBpeTokenizer(LOCKSTEP_TINY_TOKENIZER);
    if (!t.ok()) std::abort();
    return std::move(*t);
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ids = tok->Encode(text);
  const bool valid = lockstep::utf8::FirstInvalid(text) == std::string::npos;
  if (!ids.ok()) {
    if (valid || ids.status().code() != lockstep::Status::Code::kInvalidArgument ||
        ids.status().message().empty())
      std::abort();
    return 0;
  }
  if (!valid) std::abort();
  for (std::int32_t id : *ids)
    if (!tok->Has(id)) std::abort();
  const std::string back = tok->Decode(*ids);
  if (Nfc(back) != Nfc(text)) std::abort();
  lockstep::StreamDecoder dec(*tok);
  std::string streamed;
  for (std::int32_t id : *ids) streamed += dec.Push(id);
  streamed += dec.Finish();
  if (streamed != back) std::abort();
  return 0;
}
