// Binds the registry's "rdma" transport to the verbs emulation (tests/support/verbs_emulation.h,
// a test double) for the whole cofab-rdma-comm-bench binary, before main runs: the collective
// benchmark then drives the rdma transport's real code over emulated verbs, threads as ranks
// (the emulation connects queue pairs of one process only). Its figures measure cofab's CPU path
// and say nothing about a NIC; every RESULT line carries binding=emulated.
#include "fabric/transport/rdma/factory.h"
#include "tests/support/verbs_emulation.h"

namespace {

const bool kBound = [] {
  cofab::transport::rdma::setVerbsForRegistryTesting(&cofab::testing::emulatedVerbs());
  return true;
}();

}  // namespace
