#include "test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "lockstep/compare/metrics.h"
#include "lockstep/engine/splitmix.h"
#include "lockstep/engine/synthetic.h"

namespace lockstep::test {

const char* const k80BConfigJson = R"({
  "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 151936,
  "hidden_size": 2048, "num_hidden_layers": 48, "full_attention_interval": 4,
  "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
  "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_scaling": null,
  "max_position_embeddings": 262144, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
  "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
  "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
  "shared_expert_intermediate_size": 512, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "intermediate_size": 5120, "hidden_act": "silu", "rms_norm_eps": 1e-06,
  "tie_word_embeddings": false, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"})";

namespace {
struct Scratch {
  std::string path;
  Scratch() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/lockstep-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = buf.data();
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
std::mutex g_mu;
}  // namespace

const std::string& ScratchDir() {
  static Scratch s;
  return s.path;
}

std::string NewDir(const std::string& name) {
  static int counter = 0;
  std::lock_guard<std::mutex> lock(g_mu);
  std::string d = ScratchDir() + "/" + name + "-" + std::to_string(counter++);
  std::filesystem::create_directories(d);
  return d;
}

const std::string& ModelDir(const std::string& preset) {
  static std::map<std::string, std::string> dirs;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = dirs.find(preset);
  if (it != dirs.end()) return it->second;
  std::string d = ScratchDir() + "/model-" + preset;
  SyntheticOptions o;
  // "<preset>-induction" selects the in-context-copying variant of a preset, "<preset>-bf16" its
  // matrices stored as bf16 (tiny is f32 by default), "<preset>-dense" dense SwiGLU FFNs instead
  // of MoE in layers 2 and 3 (mlp_only_layers), "<preset>-lite" the preset's widths in 4 layers
  // with 4 experts (top-2), a 4096-token vocabulary and no MTP head (`wide-lite`: ~360 MB of bf16).
  auto strip = [](std::string& name, const std::string& suffix) {
    const bool has = name.size() > suffix.size() &&
                     name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (has) name.resize(name.size() - suffix.size());
    return has;
  };
  std::string base = preset;
  if (strip(base, "-bf16")) o.dtype = DType::kBF16;
  if (strip(base, "-dense")) o.mlp_only_layers = {2, 3};
  if (strip(base, "-lite")) {
    o.n_layers = 4, o.n_experts = 4, o.n_experts_used = 2, o.n_vocab = 4096;
    o.with_mtp = false;
  }
  o.induction = strip(base, "-induction");
  o.preset = base;
  o.seed = 7;
  Status s = WriteSyntheticModel(o, d);
  if (!s.ok()) throw std::runtime_error("model init failed: " + s.ToString());
  return dirs.emplace(preset, d).first->second;
}

const ModelWeights& Model(const std::string& preset) {
  static std::map<std::string, ModelWeightsPtr> models;
  const std::string& dir = ModelDir(preset);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = models.find(preset);
  if (it != models.end()) return *it->second;
  auto w = ModelWeights::Load(dir);
  if (!w.ok()) throw std::runtime_error("model load failed: " + w.status().ToString());
  return *models.emplace(preset, std::move(w).value()).first->second;
}

std::vector<std::int32_t> Tokens(int n, std::uint64_t seed) {
  std::vector<std::int32_t> t;
  std::uint64_t s = seed;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(static_cast<std::int32_t>((s >> 33) % 500));
  }
  return t;
}

std::vector<float> Random(std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::vector<float> v(n);
  // SplitMix64's own stream: the state steps by the increment SplitMix64 adds before mixing.
  std::uint64_t s = seed * kSplitMix64Gamma + 12345;
  for (std::size_t i = 0; i < n; ++i, s += kSplitMix64Gamma) {
    const std::uint64_t z = SplitMix64(s);
    double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    v[i] = static_cast<float>(lo + (hi - lo) * u);
  }
  return v;
}

CmdResult RunLockstep(const std::string& args) {
  CmdResult r;
  std::string out_path = NewDir("cmd") + "/out", err_path = out_path + ".err";
  std::string cmd = std::string(LOCKSTEP_BIN_PATH) + " " + args + " >" + out_path + " 2>" +
                    err_path + " </dev/null";
  int st = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

double Nrmse(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  return CompareF32(a.data(), b.data(), a.size()).nrmse;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int SpawnLockstep(const std::vector<std::string>& args) {
  std::vector<std::string> argv{LOCKSTEP_BIN_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  return pid;
}

int WaitChild(int pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace lockstep::test
