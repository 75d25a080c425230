#include "lockstep/instrument/fingerprint.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace lockstep {

namespace {

// RAII for the OpenSSL digest context.
struct CtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<EVP_MD_CTX, CtxDeleter>;

std::string Hex(const unsigned char* d, unsigned n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (unsigned i = 0; i < n; ++i) {
    s[2 * i] = kDigits[d[i] >> 4];
    s[2 * i + 1] = kDigits[d[i] & 15];
  }
  return s;
}

class Hasher {
 public:
  Hasher() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr); }
  void Update(const void* p, std::size_t n) { EVP_DigestUpdate(ctx_.get(), p, n); }
  std::string Final() {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    EVP_DigestFinal_ex(ctx_.get(), d, &n);
    return Hex(d, n);
  }

 private:
  CtxPtr ctx_;
};

}  // namespace

std::string Sha256Hex(std::span<const std::byte> bytes) {
  Hasher h;
  h.Update(bytes.data(), bytes.size());
  return h.Final();
}

std::string Sha256Hex(std::string_view text) {
  Hasher h;
  h.Update(text.data(), text.size());
  return h.Final();
}

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
