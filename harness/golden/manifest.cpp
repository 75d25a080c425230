// Item digests (shared with tests/golden/golden_test.cpp), the manifest's checks, one arm's run.
#include <fmt/format.h>

#include <ctime>
#include <filesystem>

#include "golden_internal.h"
#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/dtype.h"
#include "lockstep/harness/runner.h"
#include "lockstep/instrument/fingerprint.h"

namespace lockstep {

Result<std::vector<ItemDigest>> ExportItemDigests(const ExportReader& reader) {
  std::vector<ItemDigest> out;
  std::vector<unsigned char> bytes;
  std::vector<float> scales;
  for (const ExportCheckpoint& cp : reader.meta().checkpoints) {
    for (const ExportItem& it : cp.items) {
      bytes.resize(static_cast<std::size_t>(it.rows() * it.row_elems()) * it.elem_bytes());
      LOCKSTEP_RETURN_IF_ERROR(reader.ReadRows(cp, it, 0, it.rows(), bytes.data()));
      const std::string key = cp.name + "/" + it.rel;
      out.push_back(
          {key, std::string(dtype_name(it.dtype)), it.shape,
           Sha256Hex(std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()))});
      if (!it.has_scales) continue;
      scales.resize(static_cast<std::size_t>(it.rows() * it.scale_row_elems));
      LOCKSTEP_RETURN_IF_ERROR(reader.ReadScaleRows(cp, it, 0, it.rows(), scales.data()));
      out.push_back({key + "_scale",
                     "f32",
                     {it.rows(), it.scale_row_elems},
                     Sha256Hex(std::span(reinterpret_cast<const std::byte*>(scales.data()),
                                         scales.size() * sizeof(float)))});
    }
  }
  return out;
}

std::string DigestText(const ItemDigest& d) {
  std::string s = d.dtype + " [";
  for (std::size_t i = 0; i < d.shape.size(); ++i) s += (i ? "," : "") + std::to_string(d.shape[i]);
  return s + "] " + d.sha256;
}

namespace golden {

namespace fs = std::filesystem;

std::vector<const ArmSpec*> ReferenceArms(const Campaign& c) {
  std::vector<const ArmSpec*> arms;
  for (const ArmSpec& a : c.arms)
    if (a.mode == "state" && !a.control) arms.push_back(&a);
  return arms;
}

nlohmann::json DigestsToJson(const std::vector<ItemDigest>& digests) {
  nlohmann::json items = nlohmann::json::array();
  for (const ItemDigest& d : digests)
    items.push_back({{"key", d.key}, {"dtype", d.dtype}, {"shape", d.shape}, {"sha256", d.sha256}});
  return items;
}

namespace {

// Why `j` lacks `key` of the wanted type ("" when it has it).
std::string Missing(const nlohmann::json& j, const char* key, nlohmann::json::value_t type) {
  if (!j.is_object() || !j.contains(key)) return fmt::format("no key '{}'", key);
  const auto& v = j.at(key);
  const bool ok =
      type == nlohmann::json::value_t::number_integer ? v.is_number_integer() : v.type() == type;
  return ok ? "" : fmt::format("key '{}' is {}", key, v.type_name());
}

std::string CheckArm(const nlohmann::json& a) {
  using V = nlohmann::json::value_t;
  for (const auto& [k, t] :
       std::vector<std::pair<const char*, V>>{{"name", V::string},
                                              {"export", V::string},
                                              {"export_file_sha256", V::string},
                                              {"output_ids", V::array},
                                              {"stop_reason", V::string},
                                              {"items", V::array}})
    if (auto m = Missing(a, k, t); !m.empty()) return m;
  for (const auto& id : a["output_ids"])
    if (!id.is_number_integer()) return "output_ids holds a non-integer";
  for (const auto& it : a["items"]) {
    for (const char* k : {"key", "dtype", "sha256"})
      if (auto m = Missing(it, k, V::string); !m.empty()) return "an item: " + m;
    if (auto m = Missing(it, "shape", V::array); !m.empty()) return "an item: " + m;
  }
  const std::string name = a["name"].get<std::string>();
  if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos)
    return "arm name '" + name + "' is not a plain name";
  if (a["export"].get<std::string>() != "arms/" + name + "/export.h5")
    return "arm " + name + ": export is not arms/" + name + "/export.h5";
  return "";
}

}  // namespace

Result<nlohmann::json> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (!fs::exists(path))
    return Status::InvalidArgument(
        "'" + dir + "'",
        "no manifest.json: not a golden reference (record one with lockstep "
        "golden record --plan P --out DIR)");
  LOCKSTEP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, std::size_t{256} << 20));
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("'" + path + "'",
                                   "damaged manifest: " + why + " (re-record the reference)");
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not JSON");
  using V = nlohmann::json::value_t;
  for (const auto& [k, t] :
       std::vector<std::pair<const char*, V>>{{"schema", V::string},
                                              {"schema_version", V::number_integer},
                                              {"plan_sha256", V::string},
                                              {"plan_dir", V::string},
                                              {"export_schema", V::string},
                                              {"export_schema_version", V::number_integer},
                                              {"model_sha256", V::string},
                                              {"request_sha256", V::string},
                                              {"build", V::object},
                                              {"arms", V::array}})
    if (auto m = Missing(j, k, t); !m.empty()) return bad(m);
  if (j["schema"] != kSchema || j["schema_version"] != kSchemaVersion)
    return bad(fmt::format("schema {} version {}, expected {} version {}", j["schema"].dump(),
                           j["schema_version"].dump(), kSchema, kSchemaVersion));
  if (j["arms"].empty()) return bad("no arms");
  for (const auto& a : j["arms"])
    if (auto m = CheckArm(a); !m.empty()) return bad(m);
  return j;
}

Result<ChildResult> RunArm(const Campaign& c, const ArmSpec& arm, const EngineConfig& cfg,
                           const std::string& exe, const std::string& arm_dir,
                           const std::string& tokens_path, const std::vector<std::string>& extra) {
  std::error_code ec;
  fs::remove_all(arm_dir, ec);
  fs::create_directories(arm_dir, ec);
  if (ec) return Status::IOError("arm folder '" + arm_dir + "'", ec.message());
  LOCKSTEP_RETURN_IF_ERROR(WriteFileAtomic(arm_dir + "/config.json", cfg.ToJson() + "\n"));
  ChildSpec cs;
  cs.argv = ArmGenerateArgv(c, arm, exe, arm_dir, tokens_path);
  cs.argv.insert(cs.argv.end(), extra.begin(), extra.end());
  cs.stdout_path = arm_dir + "/stdout.json";
  cs.stderr_path = arm_dir + "/stderr.log";
  return RunChild(cs);
}

Result<ArmOutput> ReadArmOutput(const std::string& arm_dir) {
  auto text = ReadFile(arm_dir + "/stdout.json", std::size_t{64} << 20);
  if (!text.ok()) return Status::Runtime(arm_dir + "/stdout.json", text.status().message());
  try {
    auto j = nlohmann::json::parse(*text);
    return ArmOutput{j.at("output_ids").get<std::vector<std::int32_t>>(),
                     j.at("stop_reason").get<std::string>()};
  } catch (const nlohmann::json::exception& e) {
    return Status::Runtime(arm_dir + "/stdout.json", e.what());
  }
}

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return ts;
}

}  // namespace golden
}  // namespace lockstep
