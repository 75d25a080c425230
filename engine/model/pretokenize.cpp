#include "model/pretokenize.h"

#include <unicode/uchar.h>

#include <array>

#include "model/utf8.h"

namespace lockstep {

namespace {

// The classes the pattern tells apart. kCrLf (\r, \n) and kSpace (U+0020) are whitespace too.
enum Cls : std::uint8_t { kLetter, kNumber, kCrLf, kSpace, kWhite, kOther };

bool IsWhite(Cls c) { return c == kCrLf || c == kSpace || c == kWhite; }

Cls ClassOf(char32_t cp) {
  if (cp == '\r' || cp == '\n') return kCrLf;
  if (cp == ' ') return kSpace;
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) return kWhite;
  const std::uint32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return kLetter;
  if (mask & U_GC_N_MASK) return kNumber;
  return kOther;
}

// ASCII classes, looked up through ICU once.
const std::array<Cls, 128>& AsciiClasses() {
  static const std::array<Cls, 128> table = [] {
    std::array<Cls, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = ClassOf(c);
    return t;
  }();
  return table;
}

struct Chars {
  std::vector<char32_t> cp;
  std::vector<Cls> cls;
  std::vector<std::uint32_t> off;  // byte offset of each character, then text.size()
};

void Decode(std::string_view text, Chars& c) {
  const auto& ascii = AsciiClasses();
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    char32_t cp = b;
    std::size_t n = 1;
    if (b >= 0x80) {
      const utf8::Step st = utf8::Next(text, i);
      cp = st.kind == utf8::Kind::kValid ? st.cp : 0xFFFD;
      n = st.n;
    }
    c.cp.push_back(cp);
    c.cls.push_back(cp < 128 ? ascii[cp] : ClassOf(cp));
    c.off.push_back(static_cast<std::uint32_t>(i));
    i += n;
  }
  c.off.push_back(static_cast<std::uint32_t>(text.size()));
}

// Lower case for the contraction alternative's ASCII letters; U+017F (long s) folds to 's' under
// Oniguruma's case-insensitive matching.
char32_t Fold(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c == 0x17F) return 's';
  return c;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d): the end, or 0.
std::size_t Contraction(const Chars& c, std::size_t i, std::size_t n) {
  if (c.cp[i] != '\'' || i + 1 >= n) return 0;
  const char32_t a = Fold(c.cp[i + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 >= n) return 0;
  const char32_t b = Fold(c.cp[i + 2]);
  if ((a == 'r' || a == 'v') && b == 'e') return i + 3;
  if (a == 'l' && b == 'l') return i + 3;
  return 0;
}

// The end of the piece that starts at character i (each alternative in the pattern's order).
std::size_t MatchAt(const Chars& c, std::size_t i, std::size_t n) {
  if (std::size_t e = Contraction(c, i, n)) return e;
  const Cls k = c.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  std::size_t j = i;
  if (k != kLetter && k != kNumber && k != kCrLf && i + 1 < n && c.cls[i + 1] == kLetter) j = i + 1;
  if (c.cls[j] == kLetter) {
    while (j < n && c.cls[j] == kLetter) ++j;
    return j;
  }
  if (k == kNumber) return i + 1;  // \p{N}
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  j = (k == kSpace && i + 1 < n && c.cls[i + 1] == kOther) ? i + 1 : i;
  if (c.cls[j] == kOther) {
    while (j < n && c.cls[j] == kOther) ++j;
    while (j < n && c.cls[j] == kCrLf) ++j;
    return j;
  }
  // What is left starts with whitespace: the run [i, j).
  j = i;
  std::size_t last_crlf = n;
  while (j < n && IsWhite(c.cls[j])) {
    if (c.cls[j] == kCrLf) last_crlf = j;
    ++j;
  }
  if (last_crlf != n) return last_crlf + 1;  // \s*[\r\n]+
  if (j == n || j - i == 1) return j;        // \s+(?!\S) at the end of the text, or \s+
  return j - 1;                              // \s+(?!\S): the last blank goes to what follows
}

}  // namespace

void QwenSplit(std::string_view text, std::vector<std::uint32_t>& ends) {
  thread_local Chars c;
  c.cp.clear();
  c.cls.clear();
  c.off.clear();
  Decode(text, c);
  const std::size_t n = c.cp.size();
  std::size_t i = 0;
  while (i < n) {
    i = MatchAt(c, i, n);
    ends.push_back(c.off[i]);
  }
}

}  // namespace lockstep
