// Fingerprints: SHA-256 of bytes, files, the running executable and token sequences, as lower-case
// hex. These identify exactly what ran (DESIGN.md root attributes *_sha256).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

std::string Sha256Hex(std::span<const std::byte> bytes);
std::string Sha256Hex(std::string_view text);
// Streams the file in 1 MiB blocks. Errors: kNotFound, kIOError.
Result<std::string> Sha256File(const std::string& path);
// SHA-256 of several files in order (each file's digest, then a digest of the digests).
Result<std::string> Sha256Files(const std::vector<std::string>& paths);
// SHA-256 of /proc/self/exe. Errors: kIOError.
Result<std::string> Sha256SelfExe();
// SHA-256 of token ids as little-endian int32.
std::string Sha256Tokens(std::span<const std::int32_t> ids);

}  // namespace lockstep
