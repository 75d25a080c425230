#include "commands/output.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lockstep/engine/atomic_file.h"

namespace lockstep {

Status WriteOutput(const std::string& path, std::string_view content) {
  if (path.empty()) return Status::Ok();
  if (!IsStdout(path)) {
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!folder.empty() && !std::filesystem::is_directory(folder, ec))
      return Status::InvalidArgument("'" + path + "'",
                                     "its folder '" + folder.string() + "' does not exist");
    return WriteFileAtomic(path, content);
  }
  // Through stdio, after whatever the process printed there before, then flushed: the caller
  // may fork (RunIsolated) or exit right after.
  if (std::fwrite(content.data(), 1, content.size(), stdout) != content.size() ||
      std::fflush(stdout) != 0)
    return Status::IOError("stdout", std::strerror(errno));
  return Status::Ok();
}

bool TakesStdout(const std::vector<std::pair<std::string, std::string>>& outputs, Status* status) {
  std::string first;
  for (const auto& [flag, path] : outputs) {
    if (!IsStdout(path)) continue;
    if (!first.empty()) {
      *status = Status::InvalidArgument(
          flag + " -", "only one document can go to stdout (" + first + " - is already there)");
      return true;
    }
    first = flag;
  }
  return !first.empty();
}

}  // namespace lockstep
