#include "model/utf8.h"

namespace lockstep::utf8 {

Step Next(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {Kind::kValid, 1, b0};
  // The length and the range of the second byte, from the lead byte (Unicode table 3-7); the
  // later bytes are always 80..BF.
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Kind::kInvalid, 1, 0};
  }
  char32_t cp = b0 & (0x7F >> len);
  for (std::size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) return {Kind::kIncomplete, k, 0};
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {Kind::kInvalid, k, 0};  // the maximal subpart ends before this byte
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Kind::kValid, len, cp};
}

std::size_t FirstInvalid(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Step st = Next(s, i);
    if (st.kind != Kind::kValid) return i;
    i += st.n;
  }
  return std::string_view::npos;
}

void AppendLossy(std::string_view s, std::string& out) {
  std::size_t i = 0;
  while (i < s.size()) {
    const Step st = Next(s, i);
    if (st.kind == Kind::kValid) {
      out.append(s.substr(i, st.n));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += st.n;
  }
}

}  // namespace lockstep::utf8
