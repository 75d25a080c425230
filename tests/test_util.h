// Shared helpers for the test suites: scratch folders, synthetic models built once per process,
// deterministic random inputs (never all zeros), and running the `lockstep` binary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/engine/weights.h"

namespace lockstep::test {

// config.json of the Qwen3-Next 80B release (MODEL.md section 1; older style: top-level rope
// fields), for tests that parse configs without weights.
extern const char* const k80BConfigJson;

// A fresh folder under $TMPDIR (or /tmp) for this process; removed at exit.
const std::string& ScratchDir();
// A new empty sub-folder of ScratchDir().
std::string NewDir(const std::string& name);

// Synthetic models written once per process (preset, seed 7) and their loaded weights.
// "<preset>-induction" is the variant with induction heads (SyntheticOptions::induction),
// "<preset>-bf16" the preset with its matrices stored as bf16 (both: "<preset>-induction-bf16").
const std::string& ModelDir(const std::string& preset);
const ModelWeights& Model(const std::string& preset);

// n pseudo-random token ids in [0, 500) from `seed` (an LCG): prompts and verify windows of the
// engine tests.
std::vector<std::int32_t> Tokens(int n, std::uint64_t seed = 1);

// Deterministic uniform values in [lo, hi) (SplitMix64 counter); nonzero with probability 1.
std::vector<float> Random(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// Runs `lockstep <args>` (the built binary), capturing stdout and stderr; returns the exit code.
struct CmdResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
CmdResult RunLockstep(const std::string& args);
// Starts `lockstep args` (the built binary, output to /dev/null) as a child the test can kill;
// its pid. WaitChild reaps it: its exit code, or 128 + the signal that ended it.
int SpawnLockstep(const std::vector<std::string>& args);
int WaitChild(int pid);

// NRMSE of b against reference a (float64), as compare/ defines it.
double Nrmse(const std::vector<float>& a, const std::vector<float>& b);
bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace lockstep::test
