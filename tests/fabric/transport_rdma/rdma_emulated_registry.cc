// Binds the registry's "rdma" transport to the verbs emulation (tests/support/verbs_emulation.h)
// for the whole test binary, before any test runs: the contract suite then exercises the rdma
// transport's real code over emulated verbs. Tests named ".../rdma" in this binary are
// "rdma-emulated"; nothing here touches hardware.
#include "fabric/transport/rdma/factory.h"
#include "tests/support/verbs_emulation.h"

namespace {

const bool kBound = [] {
  cofab::transport::rdma::setVerbsForRegistryTesting(&cofab::testing::emulatedVerbs());
  return true;
}();

}  // namespace
