// Where a report's verdict box lands on screen, measured in headless Chromium (issue 20 Must-show
// 2: the verdict within the first 800 px). The product HTML carries no scripts; the probe writes a
// test copy of the page with one inline script that stores the box's getBoundingClientRect() as
// body attributes, reads them back with --dump-dom, and takes a 1280x800 screenshot of the page
// itself. Chromium runs under `timeout`, so a hung browser fails the test instead of hanging it.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace lockstep::test {

// The first Chromium on PATH (chromium, chromium-browser, google-chrome), or "" when none.
inline std::string FindChromium() {
  for (const char* c : {"chromium", "chromium-browser", "google-chrome"})
    if (std::system((std::string("command -v ") + c + " >/dev/null 2>&1").c_str()) == 0) return c;
  return "";
}

struct VerdictPlacement {
  double top = -1, bottom = -1;  // CSS px from the top of the page at 1280x800
  std::string dom;               // the dumped DOM (for messages)
};

inline std::string RunCapture(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf{};
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    ::pclose(p);
  }
  return out;
}

inline std::string ChromiumFlags() {
  return " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars "
         "--window-size=1280,800 ";
}

// Measures the element with id="verdict" of `html` (written to dir/probe.html with the probe
// script) and screenshots the page itself to dir/<png_name>. nullopt: the probe found no box.
inline std::optional<VerdictPlacement> MeasureVerdict(const std::string& chromium,
                                                      const std::string& html,
                                                      const std::string& dir,
                                                      const std::string& png_name) {
  const std::string page = dir + "/page.html", probe = dir + "/probe.html";
  std::ofstream(page) << html;
  std::string copy = html;
  const std::string script =
      "<script>(function(){var e=document.getElementById('verdict');if(!e)return;"
      "var r=e.getBoundingClientRect();document.body.setAttribute('data-verdict-top',r.top);"
      "document.body.setAttribute('data-verdict-bottom',r.bottom);})();</script>";
  const auto at = copy.rfind("</body>");
  copy.insert(at == std::string::npos ? copy.size() : at, script);
  std::ofstream(probe) << copy;
  VerdictPlacement v;
  v.dom = RunCapture("timeout 60 " + chromium + ChromiumFlags() + "--dump-dom file://" + probe +
                     " 2>/dev/null");
  std::system(("timeout 60 " + chromium + ChromiumFlags() + "--screenshot=" + dir + "/" + png_name +
               " file://" + page + " >/dev/null 2>&1")
                  .c_str());
  auto attr = [&v](const std::string& name) -> std::optional<double> {
    const std::string key = name + "=\"";
    const auto p = v.dom.find(key);
    if (p == std::string::npos) return std::nullopt;
    return std::strtod(v.dom.c_str() + p + key.size(), nullptr);
  };
  const auto top = attr("data-verdict-top"), bottom = attr("data-verdict-bottom");
  if (!top || !bottom) return std::nullopt;
  v.top = *top;
  v.bottom = *bottom;
  return v;
}

}  // namespace lockstep::test
