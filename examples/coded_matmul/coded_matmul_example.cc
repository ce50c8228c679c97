// Coded matrix multiply with injected stragglers: C = A x B split over n workers of which any k
// suffice (a systematic real MDS code), against the uncoded split that waits for every worker,
// under the same shifted-exponential delays (or a delay trace). Prints the median completion
// times and the error of the decoded product against an FP64 reference (exit 1 if any run's
// product had a NaN or inf entry).
//
// Run:
//   build/examples/coded_matmul/coded_matmul_example --n=8 --k=6 --tail-ms=20 --runs=41
//   build/examples/coded_matmul/coded_matmul_example --trace=delays.txt   (one delay in ms per
//   line)
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "coding/matmul/straggler_matmul.h"

using namespace cofab;
using namespace cofab::coding;

namespace {

struct Flags {
  int n = 8, k = 6, runs = 41;
  int64_t rows = 720, inner = 256, cols = 64;
  double shiftMs = 5, tailMs = 20;
  std::string trace;
};

bool parse(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    auto val = [&](const char* name) -> const char* {
      const size_t len = std::strlen(name);
      return std::strncmp(a, name, len) == 0 && a[len] == '=' ? a + len + 1 : nullptr;
    };
    if (const char* v = val("--n"))
      f->n = std::atoi(v);
    else if (const char* v = val("--k"))
      f->k = std::atoi(v);
    else if (const char* v = val("--runs"))
      f->runs = std::atoi(v);
    else if (const char* v = val("--rows"))
      f->rows = std::atoll(v);
    else if (const char* v = val("--inner"))
      f->inner = std::atoll(v);
    else if (const char* v = val("--cols"))
      f->cols = std::atoll(v);
    else if (const char* v = val("--shift-ms"))
      f->shiftMs = std::atof(v);
    else if (const char* v = val("--tail-ms"))
      f->tailMs = std::atof(v);
    else if (const char* v = val("--trace"))
      f->trace = v;
    else {
      std::fprintf(stderr,
                   "usage: %s [--n=8] [--k=6] [--runs=41] [--rows=720] [--inner=256] [--cols=64]\n"
                   "          [--shift-ms=5] [--tail-ms=20] [--trace=FILE]\n",
                   argv[0]);
      return false;
    }
  }
  return f->runs > 0 && f->rows > 0 && f->inner > 0 && f->cols > 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int fail(const Status& st) {
  std::fprintf(stderr, "error: %s\n", st.toString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!parse(argc, argv, &f)) return 2;
  openblas_set_num_threads(1);  // each task behaves like one single-core worker

  auto cm = CodedMatmul::create({.n = f.n, .k = f.k});
  if (!cm.ok()) return fail(cm.status());
  std::unique_ptr<DelayModel> delay;
  if (!f.trace.empty()) {
    auto t = TraceDelay::load(f.trace);
    if (!t.ok()) return fail(t.status());
    delay = std::make_unique<TraceDelay>(std::move(t).value());
  } else {
    auto d = ShiftedExponentialDelay::create({.shiftMs = f.shiftMs, .tailMeanMs = f.tailMs});
    if (!d.ok()) return fail(d.status());
    delay = std::make_unique<ShiftedExponentialDelay>(std::move(d).value());
  }
  auto exec = StragglerExecutor::create({.threads = std::max(f.n, 1)});
  if (!exec.ok()) return fail(exec.status());

  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(f.rows * f.inner), b(f.inner * f.cols), c(f.rows * f.cols);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  ConstMatrixView av{a.data(), f.rows, f.inner, 0}, bv{b.data(), f.inner, f.cols, 0};
  MatrixView cv{c.data(), f.rows, f.cols, 0};

  // FP64 reference for the error.
  std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()), want(f.rows * f.cols);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, f.rows, f.cols, f.inner, 1.0, ad.data(),
              f.inner, bd.data(), f.cols, 0.0, want.data(), f.cols);

  auto enc = cm->encode(av);
  if (!enc.ok()) return fail(enc.status());
  std::vector<double> coded, uncoded, decodeMs;
  double worstErr = 0;  // over the runs whose C is finite
  int nonFiniteRuns = 0;
  int decoded = 0;
  for (int run = 0; run < f.runs; ++run) {
    StragglerRunOptions o{.executor = exec->get(), .delay = delay.get(), .run = run};
    auto rc = runCodedMatmul(*cm, *enc, bv, cv, o);
    if (!rc.ok()) return fail(rc.status());
    double num = 0, den = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      num += (c[i] - want[i]) * (c[i] - want[i]);
      den += want[i] * want[i];
    }
    // A NaN or inf entry in C makes the error non-finite: count it apart (std::max(worst, NaN)
    // would keep the previous value and report a clean run).
    const double e = std::sqrt(num / den);
    if (std::isfinite(e)) {
      worstErr = std::max(worstErr, e);
    } else {
      ++nonFiniteRuns;
    }
    auto ru = runUncodedMatmul(av, bv, cv, f.n, o);
    if (!ru.ok()) return fail(ru.status());
    coded.push_back(rc->totalMs);
    decodeMs.push_back(rc->decodeMs);
    decoded += rc->decoded;
    uncoded.push_back(ru->totalMs);
  }
  std::printf("coded matmul (n=%d, k=%d), A %lldx%lld, B %lldx%lld, %d runs, delays %s\n", f.n, f.k,
              static_cast<long long>(f.rows), static_cast<long long>(f.inner),
              static_cast<long long>(f.inner), static_cast<long long>(f.cols), f.runs,
              delay->describe().c_str());
  std::printf("  code: %s, worst condition number over all erasure patterns %.3g\n",
              mdsFamilyName(cm->code().family()), cm->code().worstCondition());
  std::printf(
      "  coded   (any %d of %d):  median %.2f ms  (decode median %.3f ms, %d/%d runs decoded)\n",
      f.k, f.n, median(coded), median(decodeMs), decoded, f.runs);
  std::printf("  uncoded (all %d of %d):  median %.2f ms\n", f.n, f.n, median(uncoded));
  std::printf("  speedup %.2fx, worst relative error of C %.2e%s\n",
              median(uncoded) / median(coded), worstErr,
              nonFiniteRuns > 0 ? " (finite runs only: see the error below)" : "");
  if (nonFiniteRuns > 0) {
    std::fprintf(stderr, "error: C had NaN or inf entries in %d of %d runs\n", nonFiniteRuns,
                 f.runs);
    return 1;
  }
  return 0;
}
