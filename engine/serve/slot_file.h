// The container layer of slot files (lockstep/engine/slot_file.h has the format): the preamble,
// the digest and the section table, without the conversation they hold. Tools and tests use it
// to find a section's bytes (tests/serve/slot_file_test.cpp damages every section in turn).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep::slot_file {

inline constexpr char kMagic[16] = {'L', 'O', 'C', 'K', 'S', 'T',  'E',  'P',
                                    '-', 'S', 'L', 'O', 'T', '\0', '\0', '\0'};
inline constexpr std::size_t kPreambleBytes = 16 + 4 + 8;  // magic, version, header_len
inline constexpr std::size_t kDigestBytes = 32;            // SHA-256 at the end
// Headers longer than this are refused before they are parsed.
inline constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{64} << 20;

struct SectionEntry {
  std::string name;
  std::uint64_t offset = 0;  // absolute byte offset in the file
  std::uint64_t bytes = 0;
  std::string dtype;                // dtype_name(): "int32", "f32", "bf16", "int8", "uint8"
  std::vector<std::int64_t> shape;  // outermost first
  std::string sha256;               // lower-case hex of the section's bytes
};

// The section table of `bytes` (preamble and header parsed; neither digest checked, no section
// read). kCorruption when the preamble or the header cannot be read.
Result<std::vector<SectionEntry>> ReadSectionTable(std::string_view bytes);

}  // namespace lockstep::slot_file
