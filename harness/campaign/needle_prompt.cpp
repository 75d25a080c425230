// NeedleHaystackPrompt (campaign.h): a seeded prompt of filler sentences with needles ("The code
// of vault 3 is 48213.") at seeded places and a question at the end. Its bytes are part of every
// needle plan, so the generator uses nothing a platform or standard library may change (no std::
// distributions).
#include "campaign/needle_prompt.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "lockstep/engine/sampler.h"
#include "lockstep/harness/campaign.h"

namespace lockstep {
namespace {

// The SplitMix64 stream (Steele, Lea, Flood 2014) over the engine's finaliser: draw k (k = 0, 1,
// ...) is SplitMix64(seed + k * gamma), which adds gamma once more before mixing, so the draws are
// the reference generator's, whose state advances by gamma before each output.
class SplitMix64Stream {
 public:
  explicit SplitMix64Stream(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    const std::uint64_t z = SplitMix64(state_);
    state_ += kGamma;
    return z;
  }
  std::size_t Below(std::size_t n) { return static_cast<std::size_t>(Next() % n); }

 private:
  static constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // the increment SplitMix64 adds
  std::uint64_t state_;
};

// Filler words; every length 1..9 occurs, so a sentence of any length >= 3 can be built exactly.
const std::vector<std::string>& FillerWords() {
  static const std::vector<std::string> kWords{
      "a",         "by",        "of",       "in",       "on",       "to",       "the",
      "old",       "red",       "sea",      "day",      "way",      "mill",     "road",
      "rain",      "town",      "wind",     "bell",     "gate",     "lamp",     "river",
      "stone",     "field",     "light",    "quiet",    "green",    "north",    "garden",
      "bridge",    "market",    "winter",   "silver",   "window",   "morning",  "village",
      "harbour",   "lantern",   "orchard",  "mountain", "evenings", "windmill", "cottages",
      "afternoon", "travelers", "carefully"};
  return kWords;
}

// A filler sentence "Words like these. " of `len` bytes exactly (len 1..2: spaces).
std::string FillerSentence(SplitMix64Stream& rng, std::size_t len) {
  if (len < 3) return std::string(len, ' ');
  const std::vector<std::string>& words = FillerWords();
  std::string s;
  std::size_t body = len - 2;  // without ". "
  while (body > 9) {           // any word and a space, leaving at least one byte
    const std::string& w = words[rng.Below(words.size())];
    if (w.size() + 2 > body) continue;
    s += w + " ";
    body -= w.size() + 1;
  }
  std::vector<const std::string*> fit;  // the last word fills the rest exactly
  for (const std::string& w : words)
    if (w.size() == body) fit.push_back(&w);
  s += *fit[rng.Below(fit.size())];
  s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s + ". ";
}

}  // namespace

std::string NeedleHaystackPrompt(const NeedleSpec& spec) {
  SplitMix64Stream rng(spec.seed);
  const std::size_t total = spec.tokens > 0 ? static_cast<std::size_t>(spec.tokens) : 0;
  // Distinct two-digit vault numbers and five-digit codes.
  std::vector<int> vaults(90);
  std::iota(vaults.begin(), vaults.end(), 10);
  std::size_t n = static_cast<std::size_t>(std::clamp(spec.needles, 0, kMaxNeedles));
  for (std::size_t i = 0; i < n; ++i)
    std::swap(vaults[i], vaults[i + rng.Below(vaults.size() - i)]);
  std::vector<std::string> needles;
  for (std::size_t i = 0; i < n; ++i) {
    const auto code = 10000 + rng.Below(90000);
    needles.push_back("The code of vault " + std::to_string(vaults[i]) + " is " +
                      std::to_string(code) + ". ");
  }
  // Plans reject specs that cannot hold their needles; here the needles that do not fit are
  // dropped.
  while (n > 0 && kQuestionBytes + n * kNeedleBytes > total) --n;
  needles.resize(n);
  const std::string question =
      "What is the code of vault " + std::to_string(vaults[n > 0 ? rng.Below(n) : 0]) + "?";
  if (question.size() > total) return question.substr(question.size() - total);

  // Filler sentences: random ones while plenty of room is left, then one of the exact remaining
  // length.
  std::size_t filler = total - question.size() - n * kNeedleBytes;
  std::vector<std::string> pieces;
  while (filler > 120) {
    pieces.push_back(FillerSentence(rng, 30 + rng.Below(50)));
    filler -= pieces.back().size();
  }
  if (filler > 0) pieces.push_back(FillerSentence(rng, filler));

  // The needles go into seeded distinct slots among the pieces (filler order kept).
  const std::size_t slots = pieces.size() + n;
  std::vector<std::size_t> order(slots);
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (std::size_t i = 0; i < n; ++i) std::swap(order[i], order[i + rng.Below(slots - i)]);
  std::vector<bool> is_needle(slots, false);
  for (std::size_t i = 0; i < n; ++i) is_needle[order[i]] = true;

  std::string out;
  out.reserve(total);
  std::size_t next_needle = 0, next_piece = 0;
  for (std::size_t s = 0; s < slots; ++s)
    out += is_needle[s] ? needles[next_needle++] : pieces[next_piece++];
  out += question;
  return out;
}

}  // namespace lockstep
