#include "lockstep/engine/digest.h"

#include <openssl/evp.h>

namespace lockstep {

std::string HexOf(const unsigned char* raw, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[raw[i] >> 4];
    s[2 * i + 1] = kDigits[raw[i] & 15];
  }
  return s;
}

std::string HexOf(std::string_view raw) {
  return HexOf(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

struct Sha256Hasher::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256Hasher::Sha256Hasher() : ctx_(std::make_unique<Ctx>()) {
  EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr);
}
Sha256Hasher::~Sha256Hasher() = default;

void Sha256Hasher::Update(const void* p, std::size_t n) { EVP_DigestUpdate(ctx_->md, p, n); }

std::string Sha256Hasher::Final() {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_->md, d, &n);
  return std::string(reinterpret_cast<const char*>(d), n);
}

std::string Sha256(std::string_view bytes) {
  Sha256Hasher h;
  h.Update(bytes.data(), bytes.size());
  return h.Final();
}

}  // namespace lockstep
