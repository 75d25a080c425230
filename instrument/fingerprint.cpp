#include "lockstep/instrument/fingerprint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "lockstep/engine/digest.h"

namespace lockstep {

namespace {

// The engine's hasher with a hex Final: every fingerprint is lower-case hex.
class Hasher {
 public:
  void Update(const void* p, std::size_t n) { h_.Update(p, n); }
  std::string Final() { return HexOf(h_.Final()); }

 private:
  Sha256Hasher h_;
};

}  // namespace

std::string Sha256Hex(std::span<const std::byte> bytes) {
  return HexOf(Sha256(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
}

std::string Sha256Hex(std::string_view text) { return HexOf(Sha256(text)); }

Result<std::string> Sha256File(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("file '" + path + "'", "does not exist");
    return Status::IOError("cannot open '" + path + "'", std::strerror(errno));
  }
  Hasher h;
  std::unique_ptr<char[]> buf(new char[1 << 20]);
  for (;;) {
    ssize_t n = ::read(fd, buf.get(), 1 << 20);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return Status::IOError("cannot read '" + path + "'", std::strerror(e));
    }
    if (n == 0) break;
    h.Update(buf.get(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return h.Final();
}

Result<std::string> Sha256Files(const std::vector<std::string>& paths) {
  Hasher all;
  for (const auto& p : paths) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::string d, Sha256File(p));
    all.Update(d.data(), d.size());
  }
  return all.Final();
}

Result<std::string> Sha256SelfExe() {
  auto r = Sha256File("/proc/self/exe");
  if (!r.ok()) return Status::IOError("executable fingerprint", r.status().message());
  return r;
}

std::string Sha256Tokens(std::span<const std::int32_t> ids) {
  Hasher h;
  for (std::int32_t id : ids) {
    unsigned char b[4];
    auto u = static_cast<std::uint32_t>(id);
    for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(u >> (8 * i));
    h.Update(b, 4);
  }
  return h.Final();
}

}  // namespace lockstep
