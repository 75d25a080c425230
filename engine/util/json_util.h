// Exception-free access to JSON documents (nlohmann::json stays inside the .cpp files).
//
// JsonDoc wraps a parsed document; getters return Result<T> with messages that name the file and
// the key ("config.json: key 'hidden_size': expected an integer, got string"). Nothing here throws.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/engine/status.h"

namespace lockstep {

class JsonDoc {
 public:
  ~JsonDoc();
  JsonDoc(JsonDoc&&) noexcept;
  JsonDoc& operator=(JsonDoc&&) noexcept;

  // Parses `text`; `label` names the source in messages. Errors: kCorruption with parser detail.
  static Result<JsonDoc> Parse(std::string_view text, std::string label);
  // Reads and parses a file. Errors: kNotFound, kIOError, kCorruption.
  static Result<JsonDoc> ParseFile(const std::string& path);

  bool Has(std::string_view key) const;  // top-level or dotted path ("rope_parameters.rope_theta")
  Result<std::int64_t> GetInt(std::string_view key) const;
  Result<double> GetDouble(std::string_view key) const;  // accepts integers too
  Result<bool> GetBool(std::string_view key) const;
  Result<std::string> GetString(std::string_view key) const;
  Result<std::vector<std::int64_t>> GetIntList(std::string_view key) const;
  Result<std::vector<std::string>> GetStringList(std::string_view key) const;
  // Top-level keys (for unknown-key checks).
  std::vector<std::string> Keys() const;
  const std::string& label() const { return label_; }

 private:
  struct Impl;
  JsonDoc(std::unique_ptr<Impl> impl, std::string label);
  std::unique_ptr<Impl> impl_;
  std::string label_;
};

}  // namespace lockstep
