// cofab-info: the version, which backends were built and which are usable here (with the
// reason when not), and every COFAB_* parameter with its default, current value and doc.
#include <cstdio>
#include <string>

#include "core/config.h"
#include "core/param.h"
#include "fabric/bin/backend_probe.h"

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (argc == 2 && (arg == "-h" || arg == "--help")) {
    std::printf("usage: cofab-info [--params]\n");
    return 0;
  }
  const bool paramsOnly = argc == 2 && arg == "--params";
  if (argc > 1 && !paramsOnly) {
    std::fprintf(stderr, "usage: cofab-info [--params]\n");
    return 2;
  }
  if (!paramsOnly) {
    std::printf("cofab %s\n\nbackends:\n", COFAB_VERSION);
    for (const auto& b : cofab::probeBackends()) {
      std::printf("  %-5s built=%-3s usable=%-3s %s\n", b.name.c_str(), b.built ? "yes" : "no",
                  b.usable ? "yes" : "no", b.detail.c_str());
    }
    std::printf("  tcp   built=yes usable=yes always available\n\nparameters:\n");
  }
  for (const auto& p : cofab::listParams()) {
    std::string value;
    bool set = cofab::rawParamValue(p.name, &value);
    std::printf("  %-28s %-7s default=%-10s current=%-10s %s (%s)\n", p.name.c_str(),
                p.type.c_str(), p.defaultText.empty() ? "\"\"" : p.defaultText.c_str(),
                set ? value.c_str() : "(unset)", p.doc.c_str(), p.accepted.c_str());
  }
  return 0;
}
