// libFuzzer target: arbitrary bytes -> GgufFile::FromMemory (the GGUF header parser), then
// LoadGgufTokenizer on what parses (the tokenizer.ggml.* metadata).
//
// The contract under test (engine/include/lockstep/engine/gguf.h): any input either parses, with
// every tensor lying inside the buffer, or yields a kCorruption Status with a message; never a
// crash, a hang or an out-of-bounds read. Its vocabulary (bpe_tokenizer.h) either loads, and then
// encodes and decodes a text, or is a kCorruption / kNotSupported Status with a message. Built only
// with clang; `make test-fuzz` runs it for a bounded number of inputs. Any output of `lockstep
// model init --format gguf` is a good seed; corpus/gguf/vocab.gguf holds only the tokenizer
// metadata of the handwritten tiny_tokenizer.json (no tensors, so that it stays under -max_len).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "lockstep/engine/bpe_tokenizer.h"
#include "lockstep/engine/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto r = lockstep::GgufFile::FromMemory(bytes, "fuzz-input");
  if (!r.ok()) {
    if (r.status().code() != lockstep::Status::Code::kCorruption || r.status().message().empty())
      std::abort();
    return 0;
  }
  const std::byte* const end = bytes.data() + bytes.size();
  for (const lockstep::GgufTensor& t : (*r)->tensors())
    if (t.data < bytes.data() || t.data > end ||
        t.nbytes > static_cast<std::uint64_t>(end - t.data))
      std::abort();
  auto tok = lockstep::LoadGgufTokenizer(**r);
  if (!tok.ok()) {
    const auto code = tok.status().code();
    if ((code != lockstep::Status::Code::kCorruption &&
         code != lockstep::Status::Code::kNotSupported) ||
        tok.status().message().empty())
      std::abort();
    return 0;
  }
  if (*tok) {
    auto ids = (*tok)->Encode("hello world<|sp|>long caf\xc3\xa9 [PAD300]");
    if (!ids.ok()) std::abort();
    (void)(*tok)->Decode(*ids);
  }
  return 0;
}
