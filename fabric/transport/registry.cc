#include "fabric/transport/registry.h"

#include "core/config.h"
#include "fabric/transport/loopback/factory.h"
#include "fabric/transport/tcp/factory.h"
#if COFAB_HAVE_DPDK
#include "fabric/transport/dpdk/factory.h"
#endif
#if COFAB_HAVE_RDMA
#include "fabric/transport/rdma/factory.h"
#endif

namespace cofab::transport {

// The one place that knows which backends exist (DESIGN.md §4): dpdk and rdma add a branch
// here under #if COFAB_HAVE_DPDK / COFAB_HAVE_RDMA in their own issues.
StatusOr<std::shared_ptr<Context>> Registry::create(std::string_view name,
                                                    const ContextOptions& options) {
  if (name == "tcp") return tcp::createContext(options);
  if (name == "loopback") return loopback::createContext(options);
#if COFAB_HAVE_DPDK
  if (name == "dpdk") return dpdk::createContext(options);
#endif
#if COFAB_HAVE_RDMA
  if (name == "rdma") return rdma::createContext(options);
#endif
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgument("unknown transport '" + std::string(name) + "' (this build has: " +
                         known + ")");
}

std::vector<std::string> Registry::names() {
  std::vector<std::string> names = {"tcp", "loopback"};
#if COFAB_HAVE_DPDK
  names.push_back("dpdk");
#endif
#if COFAB_HAVE_RDMA
  names.push_back("rdma");
#endif
  return names;
}

}  // namespace cofab::transport
