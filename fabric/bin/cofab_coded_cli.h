// cofab-coded's command line and result check, header-only so that tests/fabric/coded can test
// them without running the binary (fabric/bin/cofab_coded_main.cc is their only other user).
//
// Every flag is "--key=value"; a key the role does not know, a malformed or out-of-range number
// and a missing store are InvalidArgument naming the flag (the binary prints it with its usage
// and exits 2). Integers go through core/param.h's parseIntIn (no atoi: "8x", "abc", "-1" and
// "" are errors, not 8, 0 and a wrapped size).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/param.h"
#include "core/status.h"
#include "fabric/coded/coded_master.h"

namespace cofab::coded::cli {

using Flags = std::map<std::string, std::string>;

// Largest A, B or C the master's demo allocates (elements of 4 bytes: 1 GiB).
inline constexpr int64_t kMaxMatrixElements = int64_t{1} << 28;

// "--key=value" arguments into a map; InvalidArgument for any other form and for a key outside
// `known`.
inline StatusOr<Flags> parseFlags(const std::vector<std::string>& args,
                                  const std::set<std::string>& known) {
  Flags flags;
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos || eq == 2) {
      return InvalidArgument("argument '" + a + "': expected --flag=value");
    }
    const std::string key = a.substr(2, eq - 2);
    if (known.count(key) == 0) return InvalidArgument("unknown flag --" + key);
    flags[key] = a.substr(eq + 1);
  }
  return flags;
}

struct WorkerConfig {
  std::string store;
  std::string name = "cofab-coded";
  std::string transport = "tcp";
  int index = -1;
};

// envStore / envRank: $COFAB_STORE and $COFAB_ROLE_RANK ("" when unset), the defaults of
// --store and --index.
inline StatusOr<WorkerConfig> parseWorkerArgs(const std::vector<std::string>& args,
                                              const std::string& envStore,
                                              const std::string& envRank) {
  COFAB_ASSIGN_OR_RETURN(Flags f, parseFlags(args, {"store", "index", "name", "transport"}));
  WorkerConfig c;
  c.store = f.count("store") ? f["store"] : envStore;
  if (c.store.empty()) return InvalidArgument("worker: need --store (or COFAB_STORE)");
  const bool fromFlag = f.count("index") != 0;
  const std::string index = fromFlag ? f["index"] : envRank;
  if (index.empty() && !fromFlag) {
    return InvalidArgument("worker: need --index (or COFAB_ROLE_RANK)");
  }
  // Worker indices are below n, and CodedMaster accepts n <= 64.
  COFAB_ASSIGN_OR_RETURN(int64_t i,
                         parseIntIn(index, fromFlag ? "--index" : "COFAB_ROLE_RANK", 0, 63));
  c.index = static_cast<int>(i);
  if (f.count("name")) c.name = f["name"];
  if (f.count("transport")) c.transport = f["transport"];
  return c;
}

struct MasterConfig {
  std::string store;
  CodedServiceOptions service;
  int64_t rows = 960, cols = 256, bCols = 16;
  int requests = 10;
};

inline StatusOr<MasterConfig> parseMasterArgs(const std::vector<std::string>& args,
                                              const std::string& envStore) {
  COFAB_ASSIGN_OR_RETURN(Flags f, parseFlags(args, {"store", "mode", "n", "k", "replicas", "rows",
                                                    "cols", "bcols", "requests", "shift_ms",
                                                    "tail_ms", "device", "name", "transport"}));
  MasterConfig c;
  c.store = f.count("store") ? f["store"] : envStore;
  if (c.store.empty()) return InvalidArgument("master: need --store (or COFAB_STORE)");
  COFAB_ASSIGN_OR_RETURN(c.service.mode, parseCodedMode(f.count("mode") ? f["mode"] : "coded"));
  // An integer flag in [min, max], or its default when absent.
  auto integer = [&](const std::string& key, int64_t def, int64_t min,
                     int64_t max) -> StatusOr<int64_t> {
    if (f.count(key) == 0) return def;
    return parseIntIn(f[key], "--" + key, min, max);
  };
  auto number = [&](const std::string& key, double def, double min,
                    double max) -> StatusOr<double> {
    if (f.count(key) == 0) return def;
    return parseDoubleIn(f[key], "--" + key, min, max);
  };
  COFAB_ASSIGN_OR_RETURN(int64_t n, integer("n", 8, 1, 64));
  COFAB_ASSIGN_OR_RETURN(int64_t k, integer("k", 6, 1, 63));
  COFAB_ASSIGN_OR_RETURN(int64_t replicas, integer("replicas", 2, 1, 64));
  c.service.n = static_cast<int>(n);
  c.service.k = static_cast<int>(k);
  c.service.replicas = static_cast<int>(replicas);
  COFAB_ASSIGN_OR_RETURN(c.service.shiftMs, number("shift_ms", 0, 0, 3600e3));
  COFAB_ASSIGN_OR_RETURN(c.service.tailMeanMs, number("tail_ms", 0, 0, 3600e3));
  if (f.count("device")) c.service.device = f["device"];  // else COFAB_CODED_DEVICE, default cpu
  if (f.count("name")) c.service.name = f["name"];
  if (f.count("transport")) c.service.transport = f["transport"];
  COFAB_ASSIGN_OR_RETURN(c.rows, integer("rows", 960, 1, kMaxMatrixElements));
  COFAB_ASSIGN_OR_RETURN(c.cols, integer("cols", 256, 1, kMaxMatrixElements));
  COFAB_ASSIGN_OR_RETURN(c.bCols, integer("bcols", 16, 1, kMaxMatrixElements));
  // Each factor is at most 2^28, so the products fit in int64_t.
  if (c.rows * c.cols > kMaxMatrixElements || c.cols * c.bCols > kMaxMatrixElements ||
      c.rows * c.bCols > kMaxMatrixElements) {
    return InvalidArgument("master: --rows=" + std::to_string(c.rows) +
                           " --cols=" + std::to_string(c.cols) +
                           " --bcols=" + std::to_string(c.bCols) + " make a matrix of more than " +
                           std::to_string(kMaxMatrixElements) + " elements");
  }
  COFAB_ASSIGN_OR_RETURN(int64_t requests, integer("requests", 10, 1, 1000000));
  c.requests = static_cast<int>(requests);
  return c;
}

// The master's check of a product C against its local reference.
struct ProductCheck {
  double maxAbsError = 0;  // over the finite entries
  double scale = 0;        // max |ref| over the finite entries
  size_t nonFinite = 0;    // entries where C or the reference is NaN or +-inf
  bool ok = false;         // no non-finite entry and maxAbsError <= tolerance x max(scale, 1)
  double relError() const { return maxAbsError / std::max(scale, 1e-30); }
};

// A NaN fails every comparison, so std::max(err, NaN) keeps err: a decode writing NaN everywhere
// would pass a max-based check with error 0. Non-finite entries are counted and fail the check.
inline ProductCheck checkProduct(const float* c, const float* ref, size_t count,
                                 double tolerance = 1e-3) {
  ProductCheck r;
  for (size_t j = 0; j < count; ++j) {
    const double cj = c[j], rj = ref[j];
    if (!std::isfinite(cj) || !std::isfinite(rj)) {
      ++r.nonFinite;
      continue;
    }
    r.maxAbsError = std::max(r.maxAbsError, std::fabs(cj - rj));
    r.scale = std::max(r.scale, std::fabs(rj));
  }
  r.ok = r.nonFinite == 0 && r.maxAbsError <= tolerance * std::max(r.scale, 1.0);
  return r;
}

}  // namespace cofab::coded::cli
