// Built instead of ps_sync.cc while the model store (ps::ModelClient) is not in the tree.
#include "fabric/sync/algorithm_base.h"

namespace cofab::sync::detail {

StatusOr<AlgorithmPtr> makeSspSync(const SyncOptions&, const SyncEnv&) {
  return Unimplemented(
      "sync ssp: the aggregators' model store (ps::ModelClient) is not in this build");
}

StatusOr<AlgorithmPtr> makeElasticSync(const SyncOptions& options, const SyncEnv&) {
  return Unimplemented("sync " + options.algorithm +
                       ": the aggregators' model store (ps::ModelClient) is not in this build");
}

}  // namespace cofab::sync::detail
