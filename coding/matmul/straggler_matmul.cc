#include "coding/matmul/straggler_matmul.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/clock.h"

namespace cofab::coding {
namespace {

Status checkOptions(const StragglerRunOptions& o) {
  if (o.executor == nullptr) return InvalidArgument("straggler matmul: executor is null");
  return OkStatus();
}

// A, B and C must be valid views with C (a.rows x b.cols) = A (a.rows x a.cols) x B (a.cols x
// b.cols). Checked before any task runs: tasks write row ranges of C (or copy into it) computed
// from A's shape, so a C shorter than A would be written past its end.
Status checkProduct(const std::string& what, ConstMatrixView a, ConstMatrixView b, MatrixView c) {
  COFAB_RETURN_IF_ERROR(a.validate((what + " A").c_str()));
  COFAB_RETURN_IF_ERROR(b.validate((what + " B").c_str()));
  COFAB_RETURN_IF_ERROR(c.validate((what + " C").c_str()));
  if (b.rows != a.cols) {
    return InvalidArgument(what + ": B has " + std::to_string(b.rows) + " rows, A has " +
                           std::to_string(a.cols) + " columns");
  }
  if (c.rows != a.rows) {
    return InvalidArgument(what + ": C has " + std::to_string(c.rows) + " rows, A has " +
                           std::to_string(a.rows));
  }
  if (c.cols != b.cols) {
    return InvalidArgument(what + ": C has " + std::to_string(c.cols) + " columns, B has " +
                           std::to_string(b.cols));
  }
  return OkStatus();
}

// Rows [first, first + count) of m.
ConstMatrixView rowRange(ConstMatrixView m, int64_t first, int64_t count) {
  return {m.data + first * m.stride(), count, m.cols, m.stride()};
}
MatrixView rowRange(MatrixView m, int64_t first, int64_t count) {
  return {m.data + first * m.stride(), count, m.cols, m.stride()};
}

}  // namespace

StatusOr<StragglerMatmulReport> runCodedMatmul(const CodedMatmul& coded, const EncodedMatrix& a,
                                               ConstMatrixView b, MatrixView c,
                                               const StragglerRunOptions& options) {
  COFAB_RETURN_IF_ERROR(checkOptions(options));
  // Refused here rather than by every task (a DataLoss "too many failed") or by decode after
  // all the work.
  COFAB_RETURN_IF_ERROR(coded.checkEncoded(a, "coded matmul"));
  COFAB_RETURN_IF_ERROR(b.validate("coded matmul B"));
  if (b.cols < 1) return InvalidArgument("coded matmul: B has no columns");
  if (b.rows != a.cols()) {
    return InvalidArgument("coded matmul: B has " + std::to_string(b.rows) + " rows, A has " +
                           std::to_string(a.cols()) + " columns");
  }
  // decode checks C too, but only after every task has run: fail before doing the work.
  COFAB_RETURN_IF_ERROR(c.validate("coded matmul C"));
  if (c.rows != a.rows() || c.cols != b.cols) {
    return InvalidArgument("coded matmul: C must be " + std::to_string(a.rows()) + "x" +
                           std::to_string(b.cols) + " (rows of A x columns of B), got " +
                           std::to_string(c.rows) + "x" + std::to_string(c.cols));
  }
  const int n = coded.n();
  const size_t outElems = static_cast<size_t>(a.blockRows()) * b.cols;
  std::vector<float> outputs(outElems * n);
  StragglerRunSpec spec{.tasks = n,
                        .neededGroups = coded.k(),
                        .load = 1.0 / coded.k(),
                        .run = options.run,
                        .delay = options.delay,
                        .deadline = options.deadline};
  COFAB_ASSIGN_OR_RETURN(
      StragglerReport exec, options.executor->run(spec, [&](int task, const CancelToken&) {
        MatrixView out{outputs.data() + task * outElems, a.blockRows(), b.cols, 0};
        return coded.multiplyTask(a, task, b, out);
      }));
  StragglerMatmulReport report;
  std::vector<TaskResult> results;
  for (int t : exec.used) results.push_back({t, outputs.data() + t * outElems});
  const int64_t t0 = nowNs();
  COFAB_ASSIGN_OR_RETURN(DecodeReport d, coded.decode(a, results, b.cols, c));
  report.decodeMs = (nowNs() - t0) / 1e6;
  report.decoded = d.decoded;
  report.exec = std::move(exec);
  report.totalMs = report.exec.completionMs + report.decodeMs;
  return report;
}

StatusOr<StragglerMatmulReport> runUncodedMatmul(ConstMatrixView a, ConstMatrixView b, MatrixView c,
                                                 int workers, const StragglerRunOptions& options) {
  COFAB_RETURN_IF_ERROR(checkOptions(options));
  COFAB_RETURN_IF_ERROR(checkProduct("uncoded matmul", a, b, c));
  if (workers < 1 || workers > a.rows) {
    return InvalidArgument("uncoded matmul: workers must be in [1, rows of A = " +
                           std::to_string(a.rows) + "], got " + std::to_string(workers));
  }
  const int64_t blockRows = (a.rows + workers - 1) / workers;
  StragglerRunSpec spec{.tasks = workers,
                        .neededGroups = workers,
                        .load = 1.0 / workers,
                        .run = options.run,
                        .delay = options.delay,
                        .deadline = options.deadline};
  // Tasks write disjoint row ranges of C directly: nothing to gather afterwards.
  COFAB_ASSIGN_OR_RETURN(StragglerReport exec,
                         options.executor->run(spec, [&](int task, const CancelToken&) {
                           // Trailing tasks may have no rows left: clamp so no view starts past the
                           // end.
                           const int64_t first = std::min<int64_t>(task * blockRows, a.rows);
                           const int64_t rows = std::min(blockRows, a.rows - first);
                           return gemmF32(rowRange(a, first, rows), b, rowRange(c, first, rows));
                         }));
  StragglerMatmulReport report;
  report.exec = std::move(exec);
  report.totalMs = report.exec.completionMs;
  return report;
}

StatusOr<StragglerMatmulReport> runReplicatedMatmul(ConstMatrixView a, ConstMatrixView b,
                                                    MatrixView c, int workers, int replicas,
                                                    const StragglerRunOptions& options) {
  COFAB_RETURN_IF_ERROR(checkOptions(options));
  COFAB_RETURN_IF_ERROR(checkProduct("replicated matmul", a, b, c));
  if (replicas < 1 || workers < replicas || workers % replicas != 0) {
    return InvalidArgument("replicated matmul: workers (" + std::to_string(workers) +
                           ") must be a positive multiple of replicas (" +
                           std::to_string(replicas) + ")");
  }
  // Before the outputs (a block's product per worker) are allocated: 2^30 replicas of a small
  // product asked for hundreds of GiB and threw bad_alloc.
  if (workers > kMaxStragglerTasks) {
    return InvalidArgument("replicated matmul: workers must be at most " +
                           std::to_string(kMaxStragglerTasks) + ", got " + std::to_string(workers));
  }
  const int blocks = workers / replicas;
  if (blocks > a.rows) return InvalidArgument("replicated matmul: more blocks than rows of A");
  const int64_t blockRows = (a.rows + blocks - 1) / blocks;
  const size_t outElems = static_cast<size_t>(blockRows) * b.cols;
  std::vector<float> outputs(outElems * workers);
  std::vector<int> groups(workers);
  for (int t = 0; t < workers; ++t) groups[t] = t / replicas;
  StragglerRunSpec spec{.tasks = workers,
                        .groups = groups,
                        .neededGroups = blocks,
                        .load = 1.0 / blocks,
                        .run = options.run,
                        .delay = options.delay,
                        .deadline = options.deadline};
  // Trailing blocks may have no rows left: clamp so no view starts past the end.
  auto firstOf = [&](int block) { return std::min<int64_t>(block * blockRows, a.rows); };
  auto rowsOf = [&](int block) { return std::min(blockRows, a.rows - firstOf(block)); };
  COFAB_ASSIGN_OR_RETURN(
      StragglerReport exec, options.executor->run(spec, [&](int task, const CancelToken&) {
        const int block = task / replicas;
        const int64_t rows = rowsOf(block);
        return gemmF32(rowRange(a, firstOf(block), rows), b,
                       MatrixView{outputs.data() + task * outElems, rows, b.cols, 0});
      }));
  StragglerMatmulReport report;
  const int64_t t0 = nowNs();
  for (int task : exec.used) {
    const int block = task / replicas;
    const int64_t rows = rowsOf(block);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(c.row(firstOf(block) + r), outputs.data() + task * outElems + r * b.cols,
                  sizeof(float) * b.cols);
    }
  }
  report.decodeMs = (nowNs() - t0) / 1e6;
  report.exec = std::move(exec);
  report.totalMs = report.exec.completionMs + report.decodeMs;
  return report;
}

}  // namespace cofab::coding
