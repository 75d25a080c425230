// What the `lockstep` binary was built from, for `lockstep --version`. The values are written
// into a generated translation unit (build/harness/version_info.cpp, from version_info.cpp.in by
// version.cmake) at build time: a new commit recompiles that one file and relinks, nothing else.
#pragma once

namespace lockstep {

struct BuildInfo {
  const char* version;  // the project version (CMakeLists.txt), "0.1.0"
  const char* commit;   // `git describe --always --dirty` of the source tree; "unknown" outside git
  const char* build_type;  // CMAKE_BUILD_TYPE, "Release"
  bool cuda;               // the CUDA backend plugin was built
};

const BuildInfo& GetBuildInfo();

}  // namespace lockstep
