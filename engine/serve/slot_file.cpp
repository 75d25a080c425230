// Slot files, the container half: preamble, digests, header JSON and the section table. The
// conversation half (which sections a state has, their shapes, building the state) is
// slot_file_state.cpp.
//
// Why the order of the checks matters: every size in the header is attacker-controlled until the
// digest has been checked, and a parser that believes a size allocates or reads past the end.
// So Decode checks the preamble and the whole-file digest before it parses a single header byte.
// Per-section digests are only used after a failed whole-file digest, to name what was damaged.
#include "serve/slot_file.h"

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "lockstep/engine/digest.h"
#include "serve/slot_file_state.h"

namespace lockstep::slot_file {

namespace {

template <typename T>
T LoadLe(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the format is little-endian, as is every supported host
  return v;
}

template <typename T>
void AppendLe(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// Magic, version and header length; the header's bytes are [kPreambleBytes, + header_len).
Result<std::uint64_t> ReadPreamble(std::string_view bytes) {
  if (bytes.size() < kPreambleBytes + kDigestBytes)
    return Status::Corruption("slot file", std::to_string(bytes.size()) +
                                               " bytes, shorter than the smallest slot file (" +
                                               std::to_string(kPreambleBytes + kDigestBytes) +
                                               "): truncated");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return Status::Corruption("slot file magic", "not a lockstep.slot file");
  const auto version = LoadLe<std::uint32_t>(bytes.data() + 16);
  if (version != kSlotFileVersion)
    return Status::InvalidArgument("slot file version", std::to_string(version) +
                                                            " (this build reads version " +
                                                            std::to_string(kSlotFileVersion) + ")");
  const auto header_len = LoadLe<std::uint64_t>(bytes.data() + 20);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - kPreambleBytes - kDigestBytes)
    return Status::Corruption("slot file header",
                              "length " + std::to_string(header_len) + " does not fit the file (" +
                                  std::to_string(bytes.size()) + " bytes): truncated or damaged");
  return header_len;
}

Result<nlohmann::json> ParseHeaderJson(std::string_view bytes, std::uint64_t header_len) {
  auto j = nlohmann::json::parse(bytes.substr(kPreambleBytes, header_len), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Corruption("slot file header", "not a JSON object");
  return j;
}

// After a failed whole-file digest: which part is damaged. Reads only what the bounds allow.
Status NameDamage(std::string_view bytes) {
  const Status digest = Status::Corruption("slot file digest",
                                           "digest mismatch: the header or the digest was altered");
  auto header_len = ReadPreamble(bytes);
  if (!header_len.ok()) return header_len.status();
  auto table = ReadSectionTable(bytes);
  if (!table.ok())
    return Status::Corruption("slot file header",
                              "damaged (digest mismatch; " + table.status().message() + ")");
  for (const SectionEntry& e : *table) {
    const std::string what = "slot file section '" + e.name + "'";
    if (e.offset > bytes.size() || e.bytes > bytes.size() - e.offset)
      return Status::Corruption(what, "truncated: the file ends at byte " +
                                          std::to_string(bytes.size()) + " (digest mismatch)");
    if (HexOf(Sha256(bytes.substr(e.offset, e.bytes))) != e.sha256)
      return Status::Corruption(what, "altered (its SHA-256 differs; digest mismatch)");
  }
  return digest;
}

Result<std::int64_t> Int(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    return Status::Corruption(where, std::string("key '") + key + "' missing or not an integer");
  return it->get<std::int64_t>();
}

Result<std::string> Str(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    return Status::Corruption(where, std::string("key '") + key + "' missing or not a string");
  return it->get<std::string>();
}

Result<SectionEntry> ParseEntry(const nlohmann::json& s, std::uint64_t data_begin, std::size_t i) {
  const std::string where = "slot file section table entry " + std::to_string(i);
  if (!s.is_object()) return Status::Corruption(where, "not an object");
  SectionEntry e;
  LOCKSTEP_ASSIGN_OR_RETURN(e.name, Str(s, "name", where));
  LOCKSTEP_ASSIGN_OR_RETURN(e.dtype, Str(s, "dtype", where));
  LOCKSTEP_ASSIGN_OR_RETURN(e.sha256, Str(s, "sha256", where));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t offset, Int(s, "offset", where));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t n, Int(s, "bytes", where));
  if (offset < 0 || n < 0) return Status::Corruption(where, "negative offset or size");
  e.offset = data_begin + static_cast<std::uint64_t>(offset);
  e.bytes = static_cast<std::uint64_t>(n);
  auto shape = s.find("shape");
  if (shape == s.end() || !shape->is_array() || shape->size() > 8)
    return Status::Corruption(where, "key 'shape' missing or not a list of at most 8 sizes");
  for (const auto& d : *shape) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
      return Status::Corruption(where, "shape holds a value that is not a size");
    e.shape.push_back(d.get<std::int64_t>());
  }
  if (s.size() != 6) return Status::Corruption(where, "unknown keys");
  return e;
}

}  // namespace

Result<std::vector<SectionEntry>> ReadSectionTable(std::string_view bytes) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::uint64_t header_len, ReadPreamble(bytes));
  LOCKSTEP_ASSIGN_OR_RETURN(nlohmann::json j, ParseHeaderJson(bytes, header_len));
  auto table = j.find("sections");
  if (table == j.end() || !table->is_array())
    return Status::Corruption("slot file header", "key 'sections' missing or not a list");
  std::vector<SectionEntry> out;
  for (std::size_t i = 0; i < table->size(); ++i) {
    LOCKSTEP_ASSIGN_OR_RETURN(SectionEntry e,
                              ParseEntry((*table)[i], kPreambleBytes + header_len, i));
    out.push_back(std::move(e));
  }
  return out;
}

// ---- the file: preamble + header + sections + digest ----

Result<std::string> EncodeFile(const nlohmann::json& header_fields,
                               const std::vector<OutSection>& sections) {
  nlohmann::json header = header_fields;
  nlohmann::json table = nlohmann::json::array();
  std::uint64_t offset = 0;
  for (const OutSection& s : sections) {
    table.push_back({{"name", s.name},
                     {"offset", offset},
                     {"bytes", s.data.size()},
                     {"dtype", s.dtype},
                     {"shape", s.shape},
                     {"sha256", HexOf(Sha256(s.data))}});
    offset += s.data.size();
  }
  header["sections"] = std::move(table);
  const std::string text = header.dump();
  std::string out;
  out.reserve(kPreambleBytes + text.size() + offset + kDigestBytes);
  out.append(kMagic, sizeof(kMagic));
  AppendLe<std::uint32_t>(out, kSlotFileVersion);
  AppendLe<std::uint64_t>(out, text.size());
  out += text;
  for (const OutSection& s : sections) out += s.data;
  out += Sha256(out);
  return out;
}

Result<ParsedFile> DecodeFile(std::string_view bytes) {
  // 1. preamble and digest, before any header byte is believed.
  LOCKSTEP_ASSIGN_OR_RETURN(std::uint64_t header_len, ReadPreamble(bytes));
  const std::string_view body = bytes.substr(0, bytes.size() - kDigestBytes);
  if (Sha256(body) != bytes.substr(body.size())) return NameDamage(bytes);
  // 2. the header, strictly.
  ParsedFile f;
  LOCKSTEP_ASSIGN_OR_RETURN(f.header, ParseHeaderJson(bytes, header_len));
  LOCKSTEP_ASSIGN_OR_RETURN(f.sections, ReadSectionTable(bytes));
  f.data_begin = kPreambleBytes + header_len;
  f.data_end = body.size();
  f.bytes = bytes;
  return f;
}

}  // namespace lockstep::slot_file
