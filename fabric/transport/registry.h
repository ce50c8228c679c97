// Registry: creates a transport Context by name, the only place that knows which backends this
// build contains ("tcp" and "loopback" always; "dpdk", "rdma" when built with them).
//
// Stateless: every create() returns a new, independent context (no process-wide instance).
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "fabric/transport/context.h"

namespace cofab::transport {

class Registry {
 public:
  // InvalidArgument for an unknown name (listing the known ones), Unavailable when the backend
  // is built but cannot run here (with the reason).
  static StatusOr<std::shared_ptr<Context>> create(std::string_view name,
                                                   const ContextOptions& options = {});
  // The names create() knows in this build, in a fixed order.
  static std::vector<std::string> names();
};

}  // namespace cofab::transport
