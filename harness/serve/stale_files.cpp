#include "serve/stale_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string_view>

namespace lockstep {

namespace {

bool StaleName(std::string_view n) {
  if (n.ends_with(".partial")) return true;
  const auto at = n.rfind(".tmp.");
  if (at == std::string_view::npos || at + 5 == n.size()) return false;
  return n.substr(at + 5).find_first_not_of("0123456789") == std::string_view::npos;
}

}  // namespace

StaleSweep RemoveStaleFiles(const std::string& dir, std::time_t before) {
  StaleSweep sweep;
  // Through the folder's descriptor (fstatat / unlinkat with no symlink following): a name
  // swapped for a symlink between the look and the removal removes the link, never its target.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return sweep;
  DIR* d = ::fdopendir(dfd);
  if (d == nullptr) {
    ::close(dfd);
    return sweep;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!StaleName(name)) continue;
    struct stat st {};
    if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_mtime >= before) continue;
    if (::unlinkat(dfd, e->d_name, 0) == 0) {
      ++sweep.files;
      sweep.bytes += static_cast<std::uint64_t>(st.st_size);
    }
  }
  ::closedir(d);  // closes dfd
  return sweep;
}

}  // namespace lockstep
