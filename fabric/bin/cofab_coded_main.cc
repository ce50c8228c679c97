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
// sgemm, one line per request with the workers used.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "coding/matmul/coded_matmul.h"
#include "fabric/coded/coded_master.h"
#include "fabric/coded/coded_worker.h"

using namespace cofab;
using namespace cofab::coded;

namespace {

std::string envOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
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

int worker(std::map<std::string, std::string>& f) {
  const std::string url = f.count("store") ? f["store"] : envOr("COFAB_STORE", "");
  const std::string index = f.count("index") ? f["index"] : envOr("COFAB_ROLE_RANK", "");
  if (url.empty() || index.empty()) {
    std::fprintf(stderr,
                 "cofab-coded worker: need --store (or COFAB_STORE) and --index (or "
                 "COFAB_ROLE_RANK)\n");
    return 2;
  }
  auto store = openStore(url, Deadline::afterMs(30000));
  if (!store.ok()) {
    std::fprintf(stderr, "cofab-coded worker: %s\n", store.status().toString().c_str());
    return 1;
  }
  Status s = runCodedWorker({.store = store->get(),
                             .name = f.count("name") ? f["name"] : "cofab-coded",
                             .index = std::atoi(index.c_str()),
                             .transport = f.count("transport") ? f["transport"] : "tcp"});
  if (!s.ok()) {
    std::fprintf(stderr, "cofab-coded worker %s: %s\n", index.c_str(), s.toString().c_str());
    return 1;
  }
  return 0;
}

int master(std::map<std::string, std::string>& f) {
  const std::string url = f.count("store") ? f["store"] : envOr("COFAB_STORE", "");
  if (url.empty()) {
    std::fprintf(stderr, "cofab-coded master: need --store or COFAB_STORE\n");
    return 2;
  }
  auto num = [&](const char* key, double def) {
    return f.count(key) ? std::atof(f[key].c_str()) : def;
  };
  auto mode = parseCodedMode(f.count("mode") ? f["mode"] : "coded");
  if (!mode.ok()) {
    std::fprintf(stderr, "cofab-coded master: %s\n", mode.status().message().c_str());
    return 2;
  }
  CodedServiceOptions o;
  o.mode = *mode;
  o.n = static_cast<int>(num("n", 8));
  o.k = static_cast<int>(num("k", 6));
  o.replicas = static_cast<int>(num("replicas", 2));
  o.shiftMs = num("shift_ms", 0);
  o.tailMeanMs = num("tail_ms", 0);
  if (f.count("device")) o.device = f["device"];  // else COFAB_CODED_DEVICE, default cpu
  if (f.count("name")) o.name = f["name"];
  if (f.count("transport")) o.transport = f["transport"];
  const int64_t rows = static_cast<int64_t>(num("rows", 960));
  const int64_t cols = static_cast<int64_t>(num("cols", 256));
  const int64_t bCols = static_cast<int64_t>(num("bcols", 16));
  const int requests = static_cast<int>(num("requests", 10));
  auto store = openStore(url, Deadline::afterMs(30000));
  if (!store.ok()) {
    std::fprintf(stderr, "cofab-coded master: %s\n", store.status().toString().c_str());
    return 1;
  }
  auto m = CodedMaster::create(store->get(), o);
  if (!m.ok()) {
    std::fprintf(stderr, "cofab-coded master: %s\n", m.status().toString().c_str());
    return 1;
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(rows * cols), b(cols * bCols), c(rows * bCols), ref(rows * bCols);
  for (float& x : a) x = u(rng);
  if (Status s = (*m)->load({a.data(), rows, cols, 0}); !s.ok()) {
    std::fprintf(stderr, "cofab-coded master: %s\n", s.toString().c_str());
    return 1;
  }
  int failures = 0;
  for (int i = 0; i < requests; ++i) {
    for (float& x : b) x = u(rng);
    auto r = (*m)->multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
    if (!r.ok()) {
      std::printf("request %d: %s\n", i, r.status().toString().c_str());
      ++failures;
      continue;
    }
    (void)coding::gemmF32({a.data(), rows, cols, 0}, {b.data(), cols, bCols, 0},
                          {ref.data(), rows, bCols, 0});
    double err = 0, scale = 0;
    for (size_t j = 0; j < c.size(); ++j) {
      err = std::max(err, static_cast<double>(std::fabs(c[j] - ref[j])));
      scale = std::max(scale, static_cast<double>(std::fabs(ref[j])));
    }
    std::string used;
    for (int w : r->used) used += (used.empty() ? "" : ",") + std::to_string(w);
    std::printf("request %d: %.2f ms, used workers %s%s, max rel error %.2e\n", i, r->totalMs,
                used.c_str(), r->decoded ? " (decoded)" : "", err / std::max(scale, 1e-30));
    if (err > 1e-3 * std::max(scale, 1.0)) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string role = argv[1];
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) return usage();
    flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  if (role == "worker") return worker(flags);
  if (role == "master") return master(flags);
  return usage();
}
