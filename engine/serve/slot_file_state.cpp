// Slot files, the conversation half: a ConversationState as header fields and sections, and back.
//
// K/V leave and enter through a scratch KvCache: AdoptPrefix + KRaw/VRaw/KScales/VScales on save,
// WriteRaw + Commit + Prefix on load, so the file holds exactly the stored elements (bf16 codes,
// int8 codes and scales) and a restored cache is bitwise the saved one. The expected section list
// is a function of the engine and a few header numbers (ExpectedSections), so load compares the
// file's table with it entry by entry before it reads any section.
#include "serve/slot_file_state.h"

#include <algorithm>
#include <cstring>

#include "lockstep/engine/atomic_file.h"
#include "lockstep/engine/digest.h"
#include "lockstep/engine/kv_cache.h"
#include "lockstep/engine/slot_file.h"

namespace lockstep {

namespace {

using nlohmann::json;
using slot_file::OutSection;
using slot_file::ParsedFile;
using slot_file::SectionEntry;

constexpr std::int64_t kMaxPolicyBytes = std::int64_t{1} << 20;

// The header's numbers that fix the shapes of the variable sections.
struct ConvHeader {
  std::string id;
  int n_tokens = 0;
  int position = 0;
  int mtp_rows = 0;
  bool has_mtp = false;  // the drafter's sections are present
  int mtp_pending = 0;   // queued rows
  int policy_bytes = 0;
};

struct Expected {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes() const {
    std::uint64_t n = dtype == "bf16" ? 2 : dtype == "int8" || dtype == "uint8" ? 1 : 4;
    for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

std::string Name(DType t) { return std::string(dtype_name(t)); }
std::string LayerBase(int il) { return "layer." + std::to_string(il); }

std::string_view FloatBytes(const float* p, std::size_t n) {
  return {reinterpret_cast<const char*>(p), n * sizeof(float)};
}

// The config's canonical JSON, and a sample of the weights (embedding and lm_head rows, every
// norm and conv kernel): two checkpoints of one preset with other seeds differ there.
std::string ConfigSha(const ModelWeights& w) { return HexOf(Sha256(w.config.ToJson())); }
std::string WeightsSha(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const auto H = static_cast<std::size_t>(c.n_embd);
  std::string s;
  for (int r : {0, c.n_vocab / 2, c.n_vocab - 1}) {
    s.append(FloatBytes(w.embed.row(r), H));
    s.append(FloatBytes(w.lm_head.row(r), H));
  }
  s.append(FloatBytes(w.final_norm, H));
  for (const LayerWeights& lw : w.layers) {
    s.append(FloatBytes(lw.input_norm, H));
    if (lw.type == LayerType::kLinearAttention)
      s.append(FloatBytes(lw.gdn.conv1d, static_cast<std::size_t>(c.conv_dim() * c.conv_kernel)));
  }
  return HexOf(Sha256(s));
}

void AddKvExpected(const Engine& e, const std::string& base, int rows, std::vector<Expected>& out) {
  const ModelConfig& c = e.weights().config;
  const DType dt = e.config().kv_dtype;
  out.push_back({base + ".k", Name(dt), {rows, c.n_heads_kv, c.head_dim}});
  out.push_back({base + ".v", Name(dt), {rows, c.n_heads_kv, c.head_dim}});
  if (dt == DType::kI8) {
    out.push_back({base + ".k_scales", "f32", {rows, c.n_heads_kv}});
    out.push_back({base + ".v_scales", "f32", {rows, c.n_heads_kv}});
  }
}

// Every section a conversation of `h`'s sizes has on engine `e`, in file order.
std::vector<Expected> ExpectedSections(const Engine& e, const ConvHeader& h) {
  const ModelConfig& c = e.weights().config;
  std::vector<Expected> out;
  out.push_back({"tokens", "int32", {h.n_tokens}});
  for (int il = 0; il < c.n_layers; ++il) {
    if (c.is_full_attention(il)) {
      AddKvExpected(e, LayerBase(il), h.position, out);
    } else {
      out.push_back({LayerBase(il) + ".conv", "f32", {c.conv_kernel - 1, c.conv_dim()}});
      out.push_back({LayerBase(il) + ".ssm", "f32", {c.n_v_heads, c.k_head_dim, c.v_head_dim}});
    }
  }
  if (e.has_mtp()) AddKvExpected(e, "mtp", h.mtp_rows, out);
  if (h.has_mtp) {
    out.push_back({"mtp.index", "int32", {2}});
    out.push_back({"mtp.pending_h", "f32", {h.mtp_pending, c.n_embd}});
    out.push_back({"mtp.pending_tokens", "int32", {h.mtp_pending}});
    out.push_back({"mtp.last_m", "f32", {c.n_embd}});
    out.push_back({"mtp.last_logits", "f32", {c.n_vocab}});
  }
  out.push_back({"decoder", "int32", {3}});
  out.push_back({"decoder.policy", "uint8", {h.policy_bytes}});
  return out;
}

KvCache ScratchCache(const Engine& e) {
  const ModelConfig& c = e.weights().config;
  return KvCache(c.n_heads_kv, c.head_dim, e.config().kv_dtype, e.config().kv_page_rows);
}

json RequestJson(const RequestOptions& o) {
  json j = {{"max_new", o.max_new},
            {"temperature", o.sampling.temperature},
            {"top_k", o.sampling.top_k},
            {"top_p", o.sampling.top_p},
            {"seed", o.sampling.seed},
            {"ignore_eos", o.ignore_eos},
            {"spec", o.spec},
            {"mtp", o.mtp},
            {"spec_max_suffix", o.spec_max_suffix},
            {"suffix_index", o.suffix_index},
            {"draft_policy", o.draft_policy},
            {"replay_path", o.replay_path},
            {"inject", o.inject}};
  // Only when set: a file of a request without penalties is what earlier builds wrote.
  if (o.sampling.penalized())
    j["penalties"] = {{"presence", o.sampling.presence_penalty},
                      {"frequency", o.sampling.frequency_penalty},
                      {"repeat", o.sampling.repeat_penalty},
                      {"repeat_last_n", o.sampling.repeat_last_n}};
  return j;
}

// ---- save ----

// Rows [0, rows) of `prefix` as the raw sections of `base`.
Status AddKvSections(const Engine& e, const std::string& base, const KvPrefixPtr& prefix, int rows,
                     std::vector<OutSection>& out) {
  KvCache c = ScratchCache(e);
  if (prefix) c.AdoptPrefix(prefix);
  if (c.rows_committed() != rows)
    return Status::InvalidArgument(
        "conversation " + base + " K/V",
        std::to_string(c.rows_committed()) + " rows, expected " + std::to_string(rows));
  const ModelConfig& mc = e.weights().config;
  const bool int8 = c.dtype() == DType::kI8;
  const std::size_t scale_bytes = static_cast<std::size_t>(mc.n_heads_kv) * sizeof(float);
  OutSection k{base + ".k", Name(c.dtype()), {rows, mc.n_heads_kv, mc.head_dim}, {}};
  OutSection v{base + ".v", k.dtype, k.shape, {}};
  OutSection ks{base + ".k_scales", "f32", {rows, mc.n_heads_kv}, {}};
  OutSection vs{base + ".v_scales", "f32", ks.shape, {}};
  for (int r = 0; r < rows; ++r) {
    k.data.append(reinterpret_cast<const char*>(c.KRaw(r)), c.row_bytes());
    v.data.append(reinterpret_cast<const char*>(c.VRaw(r)), c.row_bytes());
    if (!int8) continue;
    ks.data.append(reinterpret_cast<const char*>(c.KScales(r)), scale_bytes);
    vs.data.append(reinterpret_cast<const char*>(c.VScales(r)), scale_bytes);
  }
  out.push_back(std::move(k));
  out.push_back(std::move(v));
  if (int8) {
    out.push_back(std::move(ks));
    out.push_back(std::move(vs));
  }
  return Status::Ok();
}

template <typename T>
OutSection Pod(std::string name, std::string dtype, std::vector<std::int64_t> shape,
               const std::vector<T>& v) {
  return {std::move(name), std::move(dtype), std::move(shape),
          std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T))};
}

// Stage `is` of the snapshot that holds global layer il, and the layer's entries there.
int StageOf(const Engine& e, int il) {
  const std::vector<int>& b = e.boundaries();
  int is = 0;
  while (is + 1 < static_cast<int>(b.size()) - 1 && il >= b[static_cast<std::size_t>(is) + 1]) ++is;
  return is;
}

Status AddLayerSections(const Engine& e, const ConversationState& st, int il,
                        std::vector<OutSection>& out) {
  const ModelConfig& c = e.weights().config;
  const StageSlotSnapshot& ss = st.slot.stages[static_cast<std::size_t>(StageOf(e, il))];
  if (c.is_full_attention(il)) {
    auto it =
        std::find_if(ss.kv.begin(), ss.kv.end(), [&](const auto& p) { return p.first == il; });
    if (it == ss.kv.end())
      return Status::InvalidArgument("conversation", "no K/V for layer " + std::to_string(il));
    return AddKvSections(e, LayerBase(il), it->second, st.slot.position, out);
  }
  auto it =
      std::find_if(ss.gdn.begin(), ss.gdn.end(), [&](const auto& p) { return p.first == il; });
  if (it == ss.gdn.end())
    return Status::InvalidArgument("conversation", "no GDN state for layer " + std::to_string(il));
  const auto conv = static_cast<std::size_t>((c.conv_kernel - 1) * c.conv_dim());
  const auto ssm = static_cast<std::size_t>(c.n_v_heads * c.k_head_dim * c.v_head_dim);
  if (it->second.conv.size() != conv || it->second.ssm.size() != ssm)
    return Status::InvalidArgument("conversation", "GDN state of layer " + std::to_string(il) +
                                                       " has the wrong size for this model");
  out.push_back(
      Pod(LayerBase(il) + ".conv", "f32", {c.conv_kernel - 1, c.conv_dim()}, it->second.conv));
  out.push_back(Pod(LayerBase(il) + ".ssm", "f32", {c.n_v_heads, c.k_head_dim, c.v_head_dim},
                    it->second.ssm));
  return Status::Ok();
}

// The state's header numbers; kInvalidArgument when the state does not fit the engine.
Result<ConvHeader> HeaderOf(const Engine& e, const ConversationState& st) {
  const ModelConfig& c = e.weights().config;
  const auto bad = [](const std::string& d) { return Status::InvalidArgument("conversation", d); };
  ConvHeader h;
  h.id = st.id;
  h.n_tokens = static_cast<int>(st.tokens.size());
  h.position = st.slot.position;
  if (h.n_tokens < 1 || h.position != h.n_tokens - 1)
    return bad("position " + std::to_string(h.position) + " with " + std::to_string(h.n_tokens) +
               " tokens (a finished conversation holds all but its last token)");
  if (static_cast<int>(st.slot.stages.size()) != e.n_stages())
    return bad("snapshot of " + std::to_string(st.slot.stages.size()) + " stages, the engine has " +
               std::to_string(e.n_stages()));
  for (const StageSlotSnapshot& ss : st.slot.stages)
    if (ss.position != h.position) return bad("a stage snapshot at another position");
  h.mtp_rows = st.slot.stages.back().mtp_rows;
  h.has_mtp = st.has_mtp;
  if (h.has_mtp && !e.has_mtp()) return bad("MTP drafter state, the model has no MTP head");
  h.mtp_pending = static_cast<int>(st.mtp.pending_tokens.size());
  const auto H = static_cast<std::size_t>(c.n_embd), V = static_cast<std::size_t>(c.n_vocab);
  if (h.has_mtp && (st.mtp.pending_h.size() != static_cast<std::size_t>(h.mtp_pending) * H ||
                    st.mtp.last_m.size() != H || st.mtp.last_logits.size() != V))
    return bad("MTP drafter state of the wrong size for this model");
  h.policy_bytes = static_cast<int>(st.decoder.policy_state.size());
  if (h.policy_bytes > kMaxPolicyBytes) return bad("draft policy state over 1 MiB");
  return h;
}

json HeaderJson(const Engine& e, const ConvHeader& h, const RequestOptions& o) {
  const EngineConfig& cfg = e.config();
  return {
      {"schema", kSlotFileSchema},
      {"version", kSlotFileVersion},
      {"model",
       {{"config_sha256", ConfigSha(e.weights())}, {"weights_sha256", WeightsSha(e.weights())}}},
      {"engine",
       {{"kv_dtype", Name(cfg.kv_dtype)},
        {"kv_page_rows", cfg.kv_page_rows},
        {"prefill_chunk", cfg.prefill_chunk},
        {"snapshot_every", cfg.SnapshotGrid()},
        {"stages", e.n_stages()},
        {"boundaries", e.boundaries()}}},
      {"conversation",
       {{"id", h.id},
        {"n_tokens", h.n_tokens},
        {"position", h.position},
        {"mtp_rows", h.mtp_rows},
        {"has_mtp", h.has_mtp},
        {"mtp_pending", h.mtp_pending},
        {"policy_bytes", h.policy_bytes}}},
      {"request", RequestJson(o)}};
}

// ---- load ----

Status Bad(const std::string& what, const std::string& detail) {
  return Status::Corruption("slot file " + what, detail);
}

Result<const json*> Member(const json& j, const char* key, const std::string& where,
                           json::value_t type) {
  auto it = j.find(key);
  const bool ok =
      it != j.end() &&
      (it->type() == type ||
       (type == json::value_t::number_integer && it->type() == json::value_t::number_unsigned) ||
       (type == json::value_t::number_float && it->is_number()));
  if (!ok) return Bad(where, std::string("key '") + key + "' missing or of the wrong type");
  return &*it;
}

Result<std::int64_t> IntIn(const json& j, const char* key, const std::string& where,
                           std::int64_t lo, std::int64_t hi) {
  LOCKSTEP_ASSIGN_OR_RETURN(const json* v, Member(j, key, where, json::value_t::number_integer));
  if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    return Bad(where, std::string("'") + key + "' out of range");
  const std::int64_t x = v->get<std::int64_t>();
  if (x < lo || x > hi)
    return Bad(where, std::string("'") + key + "' = " + std::to_string(x) + " outside [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

Result<std::string> StrOf(const json& j, const char* key, const std::string& where) {
  LOCKSTEP_ASSIGN_OR_RETURN(const json* v, Member(j, key, where, json::value_t::string));
  return v->get<std::string>();
}

Result<bool> BoolOf(const json& j, const char* key, const std::string& where) {
  LOCKSTEP_ASSIGN_OR_RETURN(const json* v, Member(j, key, where, json::value_t::boolean));
  return v->get<bool>();
}

Status KeysExactly(const json& j, std::initializer_list<const char*> keys,
                   const std::string& where) {
  if (!j.is_object()) return Bad(where, "not an object");
  for (const auto& [k, v] : j.items())
    if (std::none_of(keys.begin(), keys.end(), [&](const char* x) { return k == x; }))
      return Bad(where, "unknown key '" + k + "'");
  return Status::Ok();
}

Status Mismatch(const std::string& what, const std::string& file, const std::string& here) {
  return Status::InvalidArgument("slot file " + what,
                                 "saved with " + file + ", this engine has " + here +
                                     " (restore needs the same model and state options)");
}

// The model's digests and the engine options the state depends on: kInvalidArgument when they
// differ from this engine's.
Status CheckModelAndEngine(const json& hdr, const Engine& e) {
  LOCKSTEP_ASSIGN_OR_RETURN(const json* m, Member(hdr, "model", "header", json::value_t::object));
  LOCKSTEP_RETURN_IF_ERROR(KeysExactly(*m, {"config_sha256", "weights_sha256"}, "header.model"));
  LOCKSTEP_ASSIGN_OR_RETURN(std::string cs, StrOf(*m, "config_sha256", "header.model"));
  LOCKSTEP_ASSIGN_OR_RETURN(std::string ws, StrOf(*m, "weights_sha256", "header.model"));
  if (cs != ConfigSha(e.weights()))
    return Mismatch("model", "config sha256 " + cs.substr(0, 12), "another model config");
  if (ws != WeightsSha(e.weights()))
    return Mismatch("model", "weights sha256 " + ws.substr(0, 12), "other weights");
  LOCKSTEP_ASSIGN_OR_RETURN(const json* g, Member(hdr, "engine", "header", json::value_t::object));
  LOCKSTEP_RETURN_IF_ERROR(KeysExactly(
      *g, {"kv_dtype", "kv_page_rows", "prefill_chunk", "snapshot_every", "stages", "boundaries"},
      "header.engine"));
  const EngineConfig& cfg = e.config();
  LOCKSTEP_ASSIGN_OR_RETURN(std::string kv, StrOf(*g, "kv_dtype", "header.engine"));
  if (kv != Name(cfg.kv_dtype)) return Mismatch("--kv", kv, Name(cfg.kv_dtype));
  const std::pair<const char*, int> ints[] = {{"kv_page_rows", cfg.kv_page_rows},
                                              {"prefill_chunk", cfg.prefill_chunk},
                                              {"snapshot_every", cfg.SnapshotGrid()},
                                              {"stages", e.n_stages()}};
  for (const auto& [key, here] : ints) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t v, IntIn(*g, key, "header.engine", 0, 1 << 30));
    if (v != here) return Mismatch(key, std::to_string(v), std::to_string(here));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const json* b,
                            Member(*g, "boundaries", "header.engine", json::value_t::array));
  if (*b != json(e.boundaries()))
    return Mismatch("stage split", b->dump(), json(e.boundaries()).dump());
  return Status::Ok();
}

Result<ConvHeader> ParseConversation(const json& hdr, const Engine& e) {
  const std::string w = "header.conversation";
  LOCKSTEP_ASSIGN_OR_RETURN(const json* c,
                            Member(hdr, "conversation", "header", json::value_t::object));
  LOCKSTEP_RETURN_IF_ERROR(KeysExactly(
      *c, {"id", "n_tokens", "position", "mtp_rows", "has_mtp", "mtp_pending", "policy_bytes"}, w));
  ConvHeader h;
  LOCKSTEP_ASSIGN_OR_RETURN(h.id, StrOf(*c, "id", w));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t n, IntIn(*c, "n_tokens", w, 1, 1 << 30));
  h.n_tokens = static_cast<int>(n);
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t p, IntIn(*c, "position", w, n - 1, n - 1));
  h.position = static_cast<int>(p);
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t mr, IntIn(*c, "mtp_rows", w, 0, e.has_mtp() ? p : 0));
  h.mtp_rows = static_cast<int>(mr);
  LOCKSTEP_ASSIGN_OR_RETURN(h.has_mtp, BoolOf(*c, "has_mtp", w));
  if (h.has_mtp && !e.has_mtp())
    return Status::InvalidArgument("slot file", "holds MTP drafter state; this engine has no MTP");
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t pend, IntIn(*c, "mtp_pending", w, 0, n));
  h.mtp_pending = static_cast<int>(pend);
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t pb, IntIn(*c, "policy_bytes", w, 0, kMaxPolicyBytes));
  h.policy_bytes = static_cast<int>(pb);
  return h;
}

// header.request.penalties (written only for a penalised request), range-checked as the engine
// option's are.
Status ParsePenalties(const json& p, RequestOptions& o) {
  const std::string w = "header.request.penalties";
  LOCKSTEP_RETURN_IF_ERROR(KeysExactly(p, {"presence", "frequency", "repeat", "repeat_last_n"}, w));
  auto number = [&](const char* k, double lo, double hi, double& out) -> Status {
    if (!p.contains(k) || !p.at(k).is_number() || !(p.at(k).get<double>() >= lo) ||
        !(p.at(k).get<double>() <= hi))
      return Bad(w, std::string("'") + k + "' missing or outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
    out = p.at(k).get<double>();
    return Status::Ok();
  };
  LOCKSTEP_RETURN_IF_ERROR(number("presence", -2, 2, o.sampling.presence_penalty));
  LOCKSTEP_RETURN_IF_ERROR(number("frequency", -2, 2, o.sampling.frequency_penalty));
  LOCKSTEP_RETURN_IF_ERROR(number("repeat", 1e-6, 10, o.sampling.repeat_penalty));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t n,
                            IntIn(p, "repeat_last_n", w, -1, std::int64_t{1} << 30));
  o.sampling.repeat_last_n = static_cast<int>(n);
  return Status::Ok();
}

Result<RequestOptions> ParseRequest(const json& hdr) {
  const std::string w = "header.request";
  LOCKSTEP_ASSIGN_OR_RETURN(const json* r, Member(hdr, "request", "header", json::value_t::object));
  LOCKSTEP_RETURN_IF_ERROR(KeysExactly(
      *r,
      {"max_new", "temperature", "top_k", "top_p", "seed", "ignore_eos", "spec", "mtp",
       "spec_max_suffix", "suffix_index", "draft_policy", "replay_path", "inject", "penalties"},
      w));
  RequestOptions o;
  constexpr std::int64_t kBig = std::int64_t{1} << 30;
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t max_new, IntIn(*r, "max_new", w, 0, kBig));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t top_k, IntIn(*r, "top_k", w, 0, kBig));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t spec, IntIn(*r, "spec", w, 0, kBig));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t sfx, IntIn(*r, "spec_max_suffix", w, 0, kBig));
  o.max_new = static_cast<int>(max_new);
  o.sampling.top_k = static_cast<int>(top_k);
  o.spec = static_cast<int>(spec);
  o.spec_max_suffix = static_cast<int>(sfx);
  LOCKSTEP_ASSIGN_OR_RETURN(const json* t,
                            Member(*r, "temperature", w, json::value_t::number_float));
  LOCKSTEP_ASSIGN_OR_RETURN(const json* tp, Member(*r, "top_p", w, json::value_t::number_float));
  LOCKSTEP_ASSIGN_OR_RETURN(const json* seed, Member(*r, "seed", w, json::value_t::number_integer));
  o.sampling.temperature = t->get<double>();
  o.sampling.top_p = tp->get<double>();
  o.sampling.seed = seed->get<std::uint64_t>();
  LOCKSTEP_ASSIGN_OR_RETURN(o.ignore_eos, BoolOf(*r, "ignore_eos", w));
  LOCKSTEP_ASSIGN_OR_RETURN(o.mtp, BoolOf(*r, "mtp", w));
  LOCKSTEP_ASSIGN_OR_RETURN(o.suffix_index, StrOf(*r, "suffix_index", w));
  LOCKSTEP_ASSIGN_OR_RETURN(o.draft_policy, StrOf(*r, "draft_policy", w));
  LOCKSTEP_ASSIGN_OR_RETURN(o.replay_path, StrOf(*r, "replay_path", w));
  LOCKSTEP_ASSIGN_OR_RETURN(const json* inj, Member(*r, "inject", w, json::value_t::array));
  for (const json& x : *inj) {
    if (!x.is_string()) return Bad(w, "'inject' holds a value that is not a string");
    o.inject.push_back(x.get<std::string>());
  }
  if (r->contains("penalties")) LOCKSTEP_RETURN_IF_ERROR(ParsePenalties(r->at("penalties"), o));
  return o;
}

// The file's table against the sections this engine expects, entry by entry, before any
// section is read: names, dtypes, shapes, sizes, contiguous offsets, nothing left over.
Status CheckTable(const ParsedFile& f, const std::vector<Expected>& want) {
  const auto shape = [](const std::vector<std::int64_t>& s) { return json(s).dump(); };
  std::uint64_t at = f.data_begin;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Expected& x = want[i];
    if (i >= f.sections.size())
      return Bad("section '" + x.name + "'", "missing from the section table");
    const SectionEntry& s = f.sections[i];
    const std::string what = "section '" + x.name + "'";
    if (s.name != x.name) return Bad(what, "expected here, the table has '" + s.name + "'");
    if (s.dtype != x.dtype) return Bad(what, "dtype " + s.dtype + ", expected " + x.dtype);
    if (s.shape != x.shape)
      return Bad(what, "shape " + shape(s.shape) + ", expected " + shape(x.shape) +
                           " for this model and conversation");
    if (s.bytes != x.bytes()) return Bad(what, std::to_string(s.bytes) + " bytes for its shape");
    if (s.offset != at || s.bytes > f.data_end - at)
      return Bad(what, "offset or size outside the file's data (" + std::to_string(s.offset) + ")");
    at += s.bytes;
  }
  if (f.sections.size() != want.size())
    return Bad("section '" + f.sections[want.size()].name + "'", "not expected in this file");
  if (at != f.data_end) return Bad("sections", "do not cover the data up to the digest");
  return Status::Ok();
}

class SectionReader {
 public:
  explicit SectionReader(const ParsedFile& f) : f_(f) {}
  std::string_view Bytes() { return Next().second; }
  template <typename T>
  std::vector<T> Vec() {
    std::string_view b = Bytes();
    std::vector<T> v(b.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
  }
  const std::string& last_name() const { return f_.sections[i_ - 1].name; }

 private:
  std::pair<const SectionEntry*, std::string_view> Next() {
    const SectionEntry& s = f_.sections[i_++];
    return {&s, f_.bytes.substr(s.offset, s.bytes)};
  }
  const ParsedFile& f_;
  std::size_t i_ = 0;
};

KvPrefixPtr ReadKv(const Engine& e, SectionReader& r, int rows) {
  KvCache c = ScratchCache(e);
  std::string_view k = r.Bytes(), v = r.Bytes();
  std::vector<float> ks, vs;
  if (c.dtype() == DType::kI8) {
    ks = r.Vec<float>();
    vs = r.Vec<float>();
  }
  if (rows > 0) {
    c.WriteRaw(0, rows, reinterpret_cast<const std::byte*>(k.data()),
               reinterpret_cast<const std::byte*>(v.data()), ks.data(), vs.data());
    c.Commit(rows);
  }
  return c.Prefix(rows);
}

Status CheckTokens(const std::vector<std::int32_t>& t, int V, const std::string& section) {
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i] < 0 || t[i] >= V)
      return Bad("section '" + section + "'", "token " + std::to_string(i) + " = " +
                                                  std::to_string(t[i]) +
                                                  " is outside the vocabulary");
  return Status::Ok();
}

Status ReadDrafter(SectionReader& r, const ConvHeader& h, int V, MtpDrafterState& m) {
  std::vector<std::int32_t> idx = r.Vec<std::int32_t>();
  m.next_row = idx[0];
  m.pending_p = idx[1];
  if (m.pending_p != h.mtp_rows || m.next_row != m.pending_p + h.mtp_pending ||
      m.next_row != h.position)
    return Bad("section 'mtp.index'", "next_row " + std::to_string(m.next_row) + ", pending_p " +
                                          std::to_string(m.pending_p) +
                                          " disagree with the position, the MTP rows and the "
                                          "pending rows");
  m.pending_h = r.Vec<float>();
  m.pending_tokens = r.Vec<std::int32_t>();
  LOCKSTEP_RETURN_IF_ERROR(CheckTokens(m.pending_tokens, V, "mtp.pending_tokens"));
  m.last_m = r.Vec<float>();
  m.last_logits = r.Vec<float>();
  return Status::Ok();
}

// The state, built off to the side from a file whose table CheckTable accepted.
Result<ConversationState> BuildState(const ParsedFile& f, const Engine& e, const ConvHeader& h) {
  const ModelConfig& c = e.weights().config;
  ConversationState st;
  SectionReader r(f);
  st.id = h.id;
  st.tokens = r.Vec<std::int32_t>();
  LOCKSTEP_RETURN_IF_ERROR(CheckTokens(st.tokens, c.n_vocab, "tokens"));
  st.slot.position = h.position;
  st.slot.stages.resize(static_cast<std::size_t>(e.n_stages()));
  for (StageSlotSnapshot& ss : st.slot.stages) ss.position = h.position;
  for (int il = 0; il < c.n_layers; ++il) {
    StageSlotSnapshot& ss = st.slot.stages[static_cast<std::size_t>(StageOf(e, il))];
    if (c.is_full_attention(il)) {
      ss.kv.emplace_back(il, ReadKv(e, r, h.position));
    } else {
      GdnCheckpoint g;
      g.conv = r.Vec<float>();
      g.ssm = r.Vec<float>();
      ss.gdn.emplace_back(il, std::move(g));
    }
  }
  if (e.has_mtp()) {
    st.slot.stages.back().mtp_kv = ReadKv(e, r, h.mtp_rows);
    st.slot.stages.back().mtp_rows = h.mtp_rows;
  }
  st.has_mtp = h.has_mtp;
  if (h.has_mtp) LOCKSTEP_RETURN_IF_ERROR(ReadDrafter(r, h, c.n_vocab, st.mtp));
  std::vector<std::int32_t> d = r.Vec<std::int32_t>();
  st.decoder.cur = d[0];
  st.decoder.streak = d[1];
  st.decoder.windows = d[2];
  if (d[0] < 0 || d[0] >= c.n_vocab || d[1] < 0 || d[2] < 0)
    return Bad("section 'decoder'", "cur, streak or windows out of range");
  std::string_view pol = r.Bytes();
  st.decoder.policy_state.assign(pol.data(), pol.size());
  return st;
}

}  // namespace

Result<std::string> EncodeConversation(const Engine& e, const ConversationState& st) {
  LOCKSTEP_ASSIGN_OR_RETURN(ConvHeader h, HeaderOf(e, st));
  std::vector<OutSection> secs;
  secs.push_back(Pod("tokens", "int32", {h.n_tokens}, st.tokens));
  for (int il = 0; il < e.weights().config.n_layers; ++il)
    LOCKSTEP_RETURN_IF_ERROR(AddLayerSections(e, st, il, secs));
  if (e.has_mtp())
    LOCKSTEP_RETURN_IF_ERROR(
        AddKvSections(e, "mtp", st.slot.stages.back().mtp_kv, h.mtp_rows, secs));
  if (h.has_mtp) {
    const MtpDrafterState& m = st.mtp;
    secs.push_back(
        Pod("mtp.index", "int32", {2}, std::vector<std::int32_t>{m.next_row, m.pending_p}));
    secs.push_back(
        Pod("mtp.pending_h", "f32", {h.mtp_pending, e.weights().config.n_embd}, m.pending_h));
    secs.push_back(Pod("mtp.pending_tokens", "int32", {h.mtp_pending}, m.pending_tokens));
    secs.push_back(Pod("mtp.last_m", "f32", {e.weights().config.n_embd}, m.last_m));
    secs.push_back(Pod("mtp.last_logits", "f32", {e.weights().config.n_vocab}, m.last_logits));
  }
  const DecoderState& d = st.decoder;
  secs.push_back(
      Pod("decoder", "int32", {3}, std::vector<std::int32_t>{d.cur, d.streak, d.windows}));
  secs.push_back(OutSection{"decoder.policy", "uint8", {h.policy_bytes}, d.policy_state});
  return slot_file::EncodeFile(HeaderJson(e, h, st.options), secs);
}

Result<ConversationState> DecodeConversation(std::string_view bytes, const Engine& e) {
  LOCKSTEP_ASSIGN_OR_RETURN(ParsedFile f, slot_file::DecodeFile(bytes));
  LOCKSTEP_RETURN_IF_ERROR(KeysExactly(
      f.header, {"schema", "version", "model", "engine", "conversation", "request", "sections"},
      "header"));
  LOCKSTEP_ASSIGN_OR_RETURN(std::string schema, StrOf(f.header, "schema", "header"));
  LOCKSTEP_ASSIGN_OR_RETURN(std::int64_t v, IntIn(f.header, "version", "header", 0, 1 << 30));
  if (schema != kSlotFileSchema || v != kSlotFileVersion)
    return Bad("header", "schema '" + schema + "' version " + std::to_string(v) + ", expected '" +
                             kSlotFileSchema + "' version " + std::to_string(kSlotFileVersion));
  LOCKSTEP_RETURN_IF_ERROR(CheckModelAndEngine(f.header, e));
  LOCKSTEP_ASSIGN_OR_RETURN(ConvHeader h, ParseConversation(f.header, e));
  LOCKSTEP_ASSIGN_OR_RETURN(RequestOptions opts, ParseRequest(f.header));
  LOCKSTEP_RETURN_IF_ERROR(CheckTable(f, ExpectedSections(e, h)));
  LOCKSTEP_ASSIGN_OR_RETURN(ConversationState st, BuildState(f, e, h));
  st.options = std::move(opts);
  return st;
}

Status SaveConversation(const std::string& path, const Engine& engine,
                        const ConversationState& state) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string bytes, EncodeConversation(engine, state));
  return WriteFileAtomic(path, std::string_view(bytes));
}

Result<ConversationState> LoadConversation(const std::string& path, const Engine& engine,
                                           std::uint64_t max_bytes) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, max_bytes));
  return DecodeConversation(bytes, engine);
}

}  // namespace lockstep
