// Between the two halves of the slot file code: slot_file.cpp (the container: preamble, digests,
// header, section table) and slot_file_state.cpp (a ConversationState as header fields and
// sections). Private to engine/serve.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/slot_file.h"
#include "serve/slot_file.h"

namespace lockstep::slot_file {

// One section to write: its bytes as they go to the file.
struct OutSection {
  std::string name;
  std::string dtype;  // dtype_name()
  std::vector<std::int64_t> shape;
  std::string data;
};

// A file whose preamble and digest checked out, with its header parsed (not yet checked).
struct ParsedFile {
  nlohmann::json header;
  std::vector<SectionEntry> sections;  // absolute offsets
  std::uint64_t data_begin = 0;        // first section byte
  std::uint64_t data_end = 0;          // the digest's first byte
  std::string_view bytes;              // the whole file (borrowed)
};

// `header_fields` plus the section table, then the sections and the digest.
Result<std::string> EncodeFile(const nlohmann::json& header_fields,
                               const std::vector<OutSection>& sections);
// Preamble, version and digest (kCorruption naming the damaged section when the digest fails),
// then the header JSON and the section table.
Result<ParsedFile> DecodeFile(std::string_view bytes);

}  // namespace lockstep::slot_file
