// cofab-coded: the coded task service's processes (fabric/coded/), for cofab-run or by hand.
//
//   cofab-coded worker [--store=URL] [--index=I] [--name=NAME] [--transport=tcp]
//   cofab-coded master [--store=URL] [--mode=coded|uncoded|replicated] [--n=8] [--k=6]
//                      [--replicas=2] [--rows=960] [--cols=256] [--bcols=16] [--requests=10]
//                      [--shift_ms=0] [--tail_ms=0] [--device=cpu|gpu] [--name=NAME]
//                      [--transport=tcp]
//
// The store defaults to $COFAB_STORE and the worker index to $COFAB_ROLE_RANK, so that
//   cofab-run -n 1 --role coded:8:"cofab-coded worker" -- cofab-coded master --n=8 --k=6
// starts a master and 8 workers on one host (across hosts: a TcpStore URL everyone reaches).
// The master is a smoke test and demo: random A and B, each result checked against a local
// sgemm, one line per request with the workers used; a request whose product has a NaN or inf
// entry, or an error above 1e-3 of its scale, prints MISMATCH and makes the exit status 1.
// An unknown flag, a malformed or out-of-range value, or no store: the reason and the usage on
// stderr, exit 2 (fabric/bin/cofab_coded_cli.h).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "coding/matmul/coded_matmul.h"
#include "core/param.h"
#include "fabric/bin/cofab_coded_cli.h"
#include "fabric/coded/coded_master.h"
#include "fabric/coded/coded_worker.h"

using namespace cofab;
using namespace cofab::coded;

namespace {

// A parameter declared elsewhere (COFAB_STORE in rendezvous, COFAB_ROLE_RANK by the daemons),
// read raw: this program checks it against its own range (a worker index is below 64).
std::string paramOr(const char* name, const std::string& fallback) {
  std::string v;
  return rawParamValue(name, &v) ? v : fallback;
}

int usage() {
  std::fprintf(stderr,
               "usage: cofab-coded worker [--store=URL] [--index=I] [--name=NAME]\n"
               "       cofab-coded master [--store=URL] [--mode=coded|uncoded|replicated] "
               "[--n=N] [--k=K] [--replicas=R] [--rows=R] [--cols=C] [--bcols=C] "
               "[--requests=N] [--shift_ms=MS] [--tail_ms=MS] [--device=cpu|gpu] "
               "[--name=NAME]\n");
  return 2;
}

// A command-line error: the reason, then the usage; exit 2.
int badUsage(const char* role, const Status& s) {
  std::fprintf(stderr, "cofab-coded %s: %s\n", role, s.message().c_str());
  return usage();
}

int worker(const std::vector<std::string>& args) {
  auto c = cli::parseWorkerArgs(args, paramOr("COFAB_STORE", ""), paramOr("COFAB_ROLE_RANK", ""));
  if (!c.ok()) return badUsage("worker", c.status());
  auto store = openStore(c->store, Deadline::afterMs(30000));
  if (!store.ok()) {
    std::fprintf(stderr, "cofab-coded worker: %s\n", store.status().toString().c_str());
    return 1;
  }
  Status s = runCodedWorker(
      {.store = store->get(), .name = c->name, .index = c->index, .transport = c->transport});
  if (!s.ok()) {
    std::fprintf(stderr, "cofab-coded worker %d: %s\n", c->index, s.toString().c_str());
    return 1;
  }
  return 0;
}

int master(const std::vector<std::string>& args) {
  auto c = cli::parseMasterArgs(args, paramOr("COFAB_STORE", ""));
  if (!c.ok()) return badUsage("master", c.status());
  const int64_t rows = c->rows, cols = c->cols, bCols = c->bCols;
  auto store = openStore(c->store, Deadline::afterMs(30000));
  if (!store.ok()) {
    std::fprintf(stderr, "cofab-coded master: %s\n", store.status().toString().c_str());
    return 1;
  }
  auto m = CodedMaster::create(store->get(), c->service);
  if (!m.ok()) {
    std::fprintf(stderr, "cofab-coded master: %s\n", m.status().toString().c_str());
    return 1;
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(rows * cols)), b(size_t(cols * bCols)), c2(size_t(rows * bCols)),
      ref(size_t(rows * bCols));
  for (float& x : a) x = u(rng);
  if (Status s = (*m)->load({a.data(), rows, cols, 0}); !s.ok()) {
    std::fprintf(stderr, "cofab-coded master: %s\n", s.toString().c_str());
    return 1;
  }
  int failures = 0;
  for (int i = 0; i < c->requests; ++i) {
    for (float& x : b) x = u(rng);
    auto r = (*m)->multiply({b.data(), cols, bCols, 0}, {c2.data(), rows, bCols, 0});
    if (!r.ok()) {
      std::printf("request %d: %s\n", i, r.status().toString().c_str());
      ++failures;
      continue;
    }
    (void)coding::gemmF32({a.data(), rows, cols, 0}, {b.data(), cols, bCols, 0},
                          {ref.data(), rows, bCols, 0});
    // Fails on any NaN or inf entry: a max() over the errors alone would skip NaN.
    const cli::ProductCheck check = cli::checkProduct(c2.data(), ref.data(), c2.size());
    std::string used;
    for (int w : r->used) used += (used.empty() ? "" : ",") + std::to_string(w);
    std::printf("request %d: %.2f ms, used workers %s%s, max rel error %.2e", i, r->totalMs,
                used.c_str(), r->decoded ? " (decoded)" : "", check.relError());
    if (check.nonFinite > 0) std::printf(", %zu non-finite entries", check.nonFinite);
    std::printf("%s\n", check.ok ? "" : " MISMATCH");
    if (!check.ok) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string role = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (role == "worker") return worker(args);
  if (role == "master") return master(args);
  return usage();
}
