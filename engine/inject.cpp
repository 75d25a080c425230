#include "lockstep/engine/inject.h"

#include <charconv>
#include <cmath>

namespace lockstep {

namespace {

Result<double> Number(std::string_view v, const std::string& text) {
  double d = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(d) || d < 0)
    return Status::InvalidArgument("--inject '" + text + "'", "'" + std::string(v) + "' is not a non-negative number");
  return d;
}

}  // namespace

Result<std::vector<Injection>> ParseInjections(const std::vector<std::string>& specs) {
  std::vector<Injection> out;
  for (const auto& text : specs) {
    auto bad = [&](const std::string& why) { return Status::InvalidArgument("--inject '" + text + "'", why); };
    std::string_view s = text;
    auto colon = s.find(':');
    std::string_view kind = s.substr(0, colon);
    Injection inj;
    inj.text = text;
    if (kind == "delay") {
      inj.kind = Injection::Kind::kDelay;
    } else if (kind == "perturb") {
      return Status::NotSupported("--inject '" + text + "'", "perturb injections are not built yet (only delay)");
    } else {
      return bad("unknown kind '" + std::string(kind) + "' (expected delay)");
    }
    bool have_ms = false;
    while (colon != std::string_view::npos) {
      s = s.substr(colon + 1);
      colon = s.find(':');
      std::string_view kv = s.substr(0, colon);
      auto eq = kv.find('=');
      if (eq == std::string_view::npos) return bad("expected key=value, got '" + std::string(kv) + "'");
      std::string_view key = kv.substr(0, eq), val = kv.substr(eq + 1);
      LOCKSTEP_ASSIGN_OR_RETURN(double d, Number(val, text));
      if (key == "stage") {
        inj.stage = static_cast<int>(d);
      } else if (key == "window") {
        inj.window = static_cast<int>(d);
      } else if (key == "ms") {
        inj.ms = d;
        have_ms = true;
      } else {
        return bad("unknown key '" + std::string(key) + "' (expected stage, window, ms)");
      }
    }
    if (!have_ms) return bad("a delay needs ms=M");
    out.push_back(inj);
  }
  return out;
}

}  // namespace lockstep
