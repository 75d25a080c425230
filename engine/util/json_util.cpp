#include "util/json_util.h"

#include <nlohmann/json.hpp>

#include "lockstep/engine/atomic_file.h"

namespace lockstep {

struct JsonDoc::Impl {
  nlohmann::json j;
};

JsonDoc::JsonDoc(std::unique_ptr<Impl> impl, std::string label)
    : impl_(std::move(impl)), label_(std::move(label)) {}
JsonDoc::~JsonDoc() = default;
JsonDoc::JsonDoc(JsonDoc&&) noexcept = default;
JsonDoc& JsonDoc::operator=(JsonDoc&&) noexcept = default;

Result<JsonDoc> JsonDoc::Parse(std::string_view text, std::string label) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    return Status::Corruption(label, std::string("invalid JSON: ") + e.what());
  }
  if (!impl->j.is_object())
    return Status::Corruption(label, "expected a JSON object at the top level");
  return JsonDoc(std::move(impl), std::move(label));
}

Result<JsonDoc> JsonDoc::ParseFile(const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{64} << 20));
  return Parse(text, path);
}

namespace {

const nlohmann::json* Lookup(const nlohmann::json& root, std::string_view key) {
  const nlohmann::json* cur = &root;
  std::size_t start = 0;
  while (start <= key.size()) {
    std::size_t dot = key.find('.', start);
    std::string part(
        key.substr(start, dot == std::string_view::npos ? key.size() - start : dot - start));
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(part);
    if (it == cur->end()) return nullptr;
    cur = &*it;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return cur;
}

std::string TypeName(const nlohmann::json& j) { return j.type_name(); }

}  // namespace

bool JsonDoc::Has(std::string_view key) const {
  const nlohmann::json* v = Lookup(impl_->j, key);
  return v != nullptr && !v->is_null();
}

#define LOCKSTEP_JSON_LOOKUP_(v, key)              \
  const nlohmann::json* v = Lookup(impl_->j, key); \
  if (v == nullptr || v->is_null())                \
  return Status::NotFound(label_, "missing key '" + std::string(key) + "'")

Result<std::int64_t> JsonDoc::GetInt(std::string_view key) const {
  LOCKSTEP_JSON_LOOKUP_(v, key);
  if (v->is_number_integer()) return v->get<std::int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (d == static_cast<double>(static_cast<std::int64_t>(d))) return static_cast<std::int64_t>(d);
  }
  return Status::Corruption(
      label_, "key '" + std::string(key) + "': expected an integer, got " + TypeName(*v));
}

Result<double> JsonDoc::GetDouble(std::string_view key) const {
  LOCKSTEP_JSON_LOOKUP_(v, key);
  if (v->is_number()) return v->get<double>();
  return Status::Corruption(
      label_, "key '" + std::string(key) + "': expected a number, got " + TypeName(*v));
}

Result<bool> JsonDoc::GetBool(std::string_view key) const {
  LOCKSTEP_JSON_LOOKUP_(v, key);
  if (v->is_boolean()) return v->get<bool>();
  return Status::Corruption(
      label_, "key '" + std::string(key) + "': expected true/false, got " + TypeName(*v));
}

Result<std::string> JsonDoc::GetString(std::string_view key) const {
  LOCKSTEP_JSON_LOOKUP_(v, key);
  if (v->is_string()) return v->get<std::string>();
  return Status::Corruption(
      label_, "key '" + std::string(key) + "': expected a string, got " + TypeName(*v));
}

Result<std::vector<std::int64_t>> JsonDoc::GetIntList(std::string_view key) const {
  LOCKSTEP_JSON_LOOKUP_(v, key);
  if (!v->is_array())
    return Status::Corruption(
        label_, "key '" + std::string(key) + "': expected a list of integers, got " + TypeName(*v));
  std::vector<std::int64_t> out;
  for (const auto& e : *v) {
    if (!e.is_number_integer())
      return Status::Corruption(label_, "key '" + std::string(key) +
                                            "': expected a list of integers, found " + TypeName(e));
    out.push_back(e.get<std::int64_t>());
  }
  return out;
}

Result<std::vector<std::string>> JsonDoc::GetStringList(std::string_view key) const {
  LOCKSTEP_JSON_LOOKUP_(v, key);
  if (!v->is_array())
    return Status::Corruption(
        label_, "key '" + std::string(key) + "': expected a list of strings, got " + TypeName(*v));
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string())
      return Status::Corruption(label_, "key '" + std::string(key) +
                                            "': expected a list of strings, found " + TypeName(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<std::string> JsonDoc::Keys() const {
  std::vector<std::string> keys;
  for (auto it = impl_->j.begin(); it != impl_->j.end(); ++it) keys.push_back(it.key());
  return keys;
}

}  // namespace lockstep
