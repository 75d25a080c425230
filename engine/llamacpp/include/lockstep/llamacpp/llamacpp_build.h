// Whether this build carries the llama.cpp adapter (issue 38) and which llama.cpp it was compiled
// against. Always linked (the answers are "no" and "" in a build without the headers), so the CLI
// and tests ask here instead of testing a macro.
#pragma once

#include "lockstep/engine/status.h"

namespace lockstep {

// True when the adapter was compiled (cmake -DLOCKSTEP_LLAMACPP=ON, the headers in the cache).
bool LlamaCppBuilt();
// The llama.cpp commit of the headers the adapter was compiled against ("" when not built).
const char* LlamaCppBuiltCommit();
// Ok when `--engine llama.cpp` can run here: the adapter is built and the libraries load (the
// folder LOCKSTEP_LLAMACPP_DIR names, else the build's cache). Otherwise the error that command
// exits 2 with, naming scripts/install-llamacpp.sh (tests skip with it).
Status LlamaCppAvailable();
// The hint every "llama.cpp is not available" error ends with.
inline constexpr const char* kLlamaCppInstallHint =
    "run scripts/install-llamacpp.sh, then reconfigure (cmake -DLOCKSTEP_LLAMACPP=ON)";

}  // namespace lockstep
