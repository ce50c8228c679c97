// C = A x B on a StragglerExecutor three ways, for comparing under the same delays:
//   runCodedMatmul       n coded tasks (load 1/k each), done when any k have returned, + decode
//   runUncodedMatmul     A split over `workers` tasks (load 1/workers), done when all returned
//   runReplicatedMatmul  A split into workers/replicas blocks, each computed by `replicas`
//                        tasks; done when every block has one copy
// Same delay model and run index give the same per-task random draws across the three.
// Views and shapes (C = rows of A x columns of B, B's rows = A's columns) are checked before any
// task runs: InvalidArgument naming the mismatch, and nothing written.
//
// Ownership: all views are borrowed for the call; the executor is borrowed. One call at a time
// per executor.
#pragma once

#include "coding/matmul/coded_matmul.h"
#include "coding/matmul/straggler_executor.h"

namespace cofab::coding {

struct StragglerMatmulReport {
  StragglerReport exec;
  double decodeMs = 0;  // decode (coded) or gathering replica outputs (replicated)
  double totalMs = 0;   // exec.completionMs + decodeMs
  bool decoded = false;
};

struct StragglerRunOptions {
  StragglerExecutor* executor = nullptr;
  const DelayModel* delay = nullptr;  // null = none
  int64_t run = 0;
  Deadline deadline = Deadline::never();  // see StragglerRunSpec::deadline
};

StatusOr<StragglerMatmulReport> runCodedMatmul(const CodedMatmul& coded, const EncodedMatrix& a,
                                               ConstMatrixView b, MatrixView c,
                                               const StragglerRunOptions& options);

StatusOr<StragglerMatmulReport> runUncodedMatmul(ConstMatrixView a, ConstMatrixView b, MatrixView c,
                                                 int workers, const StragglerRunOptions& options);

StatusOr<StragglerMatmulReport> runReplicatedMatmul(ConstMatrixView a, ConstMatrixView b,
                                                    MatrixView c, int workers, int replicas,
                                                    const StragglerRunOptions& options);

}  // namespace cofab::coding
