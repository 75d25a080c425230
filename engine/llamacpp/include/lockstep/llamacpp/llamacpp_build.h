// Whether this build carries the llama.cpp adapter (issue 38) and which llama.cpp it was compiled
// against. Always linked (the answers are "no" and "" in a build without the headers), so the CLI
// and tests ask here instead of testing a macro.
#pragma once

namespace lockstep {

// True when the adapter was compiled (cmake -DLOCKSTEP_LLAMACPP=ON, the headers in the cache).
bool LlamaCppBuilt();
// The llama.cpp commit of the headers the adapter was compiled against ("" when not built).
const char* LlamaCppBuiltCommit();
// The hint every "llama.cpp is not available" error ends with.
inline constexpr const char* kLlamaCppInstallHint =
    "run scripts/install-llamacpp.sh, then reconfigure (cmake -DLOCKSTEP_LLAMACPP=ON)";

}  // namespace lockstep
