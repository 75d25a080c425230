// libFuzzer target: arbitrary bytes -> SafetensorsFile::FromMemory.
//
// The contract under test (engine/include/lockstep/engine/safetensors.h): any input either
// parses, with every tensor lying inside the buffer, or yields a kCorruption Status with a
// message; never a crash, a hang or an out-of-bounds read. Built only with clang (see
// CMakeLists.txt here); run e.g. `./safetensors_fuzz -max_total_time=60 corpus/`. A valid seed
// file (any output of WriteSafetensors or `lockstep model init`) makes a good corpus entry.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "lockstep/engine/dtype.h"
#include "lockstep/engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  lockstep::Result<lockstep::SafetensorsFilePtr> r =
      lockstep::SafetensorsFile::FromMemory(bytes, "fuzz-input");
  if (!r.ok()) {
    // Malformed input must be reported as corruption, with a message.
    if (r.status().code() != lockstep::Status::Code::kCorruption || r.status().message().empty()) {
      std::abort();
    }
    return 0;
  }
  const std::byte* const end = bytes.data() + bytes.size();
  for (const lockstep::TensorInfo& t : (*r)->tensors()) {
    if (t.data < bytes.data() || t.data > end ||
        t.nbytes > static_cast<std::size_t>(end - t.data)) {
      std::abort();
    }
    if (static_cast<std::uint64_t>(t.numel()) * lockstep::dtype_size(t.dtype) != t.nbytes) {
      std::abort();
    }
    // Read every byte so AddressSanitizer checks the whole claimed range.
    volatile unsigned sink = 0;
    for (std::size_t i = 0; i < t.nbytes; ++i) sink = sink + static_cast<unsigned>(t.data[i]);
    (void)sink;
  }
  return 0;
}
