#include "help.h"

#include <algorithm>
#include <sstream>

#include "engine_flags.h"

namespace lockstep {

std::string GroupedFormatter::make_help(const CLI::App* app, std::string name,
                                        CLI::AppFormatMode mode) const {
  if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
  // CLI11's make_help with make_groups' loop over sorted groups (make_groups is not virtual).
  const auto& order = HelpGroupOrder();
  auto rank = [&](const std::string& g) -> std::size_t {
    if (g == "Options") return 0;
    const auto it = std::find(order.begin(), order.end(), g);
    return it == order.end() ? order.size() + 1 : static_cast<std::size_t>(it - order.begin()) + 1;
  };
  std::vector<std::string> groups = app->get_groups();  // in first-use order
  std::stable_sort(groups.begin(), groups.end(),
                   [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  std::stringstream out;
  out << make_description(app) << make_usage(app, name) << make_positionals(app);
  for (const std::string& group : groups) {
    const auto opts = app->get_options(
        [&](const CLI::Option* o) { return o->get_group() == group && o->nonpositional(); });
    if (!group.empty() && !opts.empty()) out << make_group(group, false, opts);  // "\nGroup:\n..."
  }
  out << make_subcommands(app, mode) << '\n' << make_footer(app);
  return out.str();
}

std::size_t EditDistance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string NearestName(std::string_view word, const std::vector<std::string>& candidates) {
  const std::size_t limit = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  std::string best;
  std::size_t best_d = limit + 1;
  for (const std::string& c : candidates) {
    const std::size_t d = EditDistance(word, c);
    if (d < best_d) best = c, best_d = d;
  }
  return best;
}

const CLI::App& GivenCommand(const CLI::App& app) {
  for (const CLI::App* sc : app.get_subcommands())
    if (sc->parsed()) return GivenCommand(*sc);
  return app;
}

std::string UsageMessage(const CLI::App& parsed, const CLI::ParseError& e, int argc, char** argv) {
  std::vector<std::string> names;  // without the leading "--"
  for (const CLI::Option* o : parsed.get_options())
    for (const std::string& l : o->get_lnames()) names.push_back(l);
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;  // what follows is positional
    if (arg.size() < 3 || arg.substr(0, 2) != "--") continue;
    arg.remove_prefix(2);
    arg = arg.substr(0, arg.find('='));
    if (std::find(names.begin(), names.end(), arg) != names.end()) continue;
    const std::string near = NearestName(arg, names);
    std::string m = "unknown option --" + std::string(arg);
    if (!near.empty()) m += "; did you mean --" + near + "?";
    return m;
  }
  return e.what();
}

}  // namespace lockstep
