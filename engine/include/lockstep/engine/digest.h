// SHA-256 and lower-case hex: the one wrapper of OpenSSL's digest and the one hex spelling of
// bytes, used by the slot files (engine/serve), the fingerprints (instrument/fingerprint.h) and
// the server's instance ids. Thread safety: every function and each Sha256Hasher on its own
// thread; a hasher is not shared.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace lockstep {

// "0123456789abcdef" spelling of `raw`, two characters per byte, high nibble first.
std::string HexOf(std::string_view raw);
std::string HexOf(const unsigned char* raw, std::size_t n);

// An incremental SHA-256 (OpenSSL EVP): Update any number of times, then Final once.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(const void* p, std::size_t n);
  // The 32 raw digest bytes; the hasher is spent afterwards.
  std::string Final();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// SHA-256 of `bytes`: 32 raw bytes.
std::string Sha256(std::string_view bytes);

}  // namespace lockstep
