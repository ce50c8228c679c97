#include "examples/train_mnist/train_options.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/param.h"
#include "fabric/sync/sync_algorithm.h"

namespace cofab::examples {

Status requireOneStepPerEpoch(size_t samples, int batch) {
  if (batch < 1 || samples < size_t(batch)) {
    return InvalidArgument(std::to_string(samples) + " training samples make no step of --batch " +
                           std::to_string(batch) +
                           " per epoch: use a smaller --batch or a larger --limit");
  }
  return OkStatus();
}

StatusOr<TrainOptions> parseTrainOptions(const std::vector<std::string>& args) {
  TrainOptions o;
  SyncTrainConfig& a = o.algo;
  for (size_t i = 0; i < args.size(); i += 2) {
    const std::string& name = args[i];
    if (i + 1 >= args.size()) return InvalidArgument(name + " needs a value");
    const std::string& v = args[i + 1];
    if (v.empty()) return InvalidArgument(name + " needs a value, got ''");
    // Integer options: parseIntIn with the option's range.
    auto integer = [&](int64_t min, int64_t max) { return parseIntIn(v, name, min, max); };
    auto number = [&](double min, double max) { return parseDoubleIn(v, name, min, max); };
    auto onOff = [&]() -> StatusOr<bool> {
      if (v == "on") return true;
      if (v == "off") return false;
      return InvalidArgument(name + " expects on or off, got '" + v + "'");
    };
    if (name == "--epochs") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(1, 1000000));
      o.epochs = int(x);
    } else if (name == "--batch") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(1, 1 << 20));
      o.batch = int(x);
    } else if (name == "--hidden") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(1, 1 << 16));
      o.hidden = int(x);
    } else if (name == "--lr") {
      COFAB_ASSIGN_OR_RETURN(double x, number(0, 1000));
      if (!(x > 0)) return InvalidArgument("--lr must be > 0, got '" + v + "'");
      o.lr = float(x);
    } else if (name == "--momentum") {
      COFAB_ASSIGN_OR_RETURN(double x, number(0, 1));
      if (!(x < 1)) return InvalidArgument("--momentum must be below 1, got '" + v + "'");
      o.momentum = float(x);
    } else if (name == "--seed") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(0, std::numeric_limits<int64_t>::max()));
      o.seed = uint64_t(x);
    } else if (name == "--limit") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(0, 1000000000));
      o.limit = size_t(x);
    } else if (name == "--data-dir") {
      o.dataDir = v;
    } else if (name == "--sync") {
      o.sync = v;
    } else if (name == "--threads") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(1, 256));
      a.threads = int(x);
    } else if (name == "--sync-every") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(0, 1000000));
      a.syncEvery = int(x);
    } else if (name == "--elastic-alpha") {
      COFAB_ASSIGN_OR_RETURN(double x, number(0, 1));
      if (!(x < 1)) return InvalidArgument("--elastic-alpha must be below 1, got '" + v + "'");
      a.elasticAlpha = float(x);
    } else if (name == "--shadow-interval-ms") {
      COFAB_ASSIGN_OR_RETURN(a.shadowIntervalMs, integer(0, 3600000));
    } else if (name == "--compression-block") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(0, 1 << 30));
      a.compressionBlock = size_t(x);
    } else if (name == "--slow-rank") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(-1, 1 << 20));
      a.slowRank = int(x);
    } else if (name == "--slow-factor") {
      COFAB_ASSIGN_OR_RETURN(a.slowFactor, number(1, 1000));
    } else if (name == "--device-ms") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(0, 60000));
      a.deviceMs = int(x);
    } else if (name == "--gradient-stragglers") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(0, 65535));
      a.gradientStragglers = int(x);
    } else if (name == "--gradcode-window") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, integer(1, 1 << 20));
      a.gradcodeWindow = int(x);
    } else if (name == "--gossip-peers") {
      a.gossipPeers = v;
    } else if (name == "--shadow-mode") {
      a.shadowMode = v;
    } else if (name == "--reply-feedback") {
      COFAB_ASSIGN_OR_RETURN(a.replyFeedback, onOff());
    } else if (name == "--nesterov") {
      COFAB_ASSIGN_OR_RETURN(a.onebitNesterov, onOff());
    } else if (name == "--staleness-unit") {
      a.stalenessUnit = v;
    } else {
      return InvalidArgument("unknown option " + name);
    }
  }
  // The options of the sync algorithms (o.algo) mean nothing to the gradient paths (--sync local,
  // aggregator, ...): they were parsed and dropped, and `--sync aggregator --slow-rank 1` ran
  // with no slow rank.
  if (!sync::isSyncAlgorithm(o.sync)) {
    static const char* const kAlgorithmOnly[] = {"--threads",
                                                 "--sync-every",
                                                 "--elastic-alpha",
                                                 "--shadow-interval-ms",
                                                 "--compression-block",
                                                 "--slow-rank",
                                                 "--slow-factor",
                                                 "--device-ms",
                                                 "--gradient-stragglers",
                                                 "--gradcode-window",
                                                 "--gossip-peers",
                                                 "--shadow-mode",
                                                 "--reply-feedback",
                                                 "--nesterov",
                                                 "--staleness-unit"};
    for (size_t i = 0; i < args.size(); i += 2) {
      for (const char* only : kAlgorithmOnly) {
        if (args[i] == only) {
          return InvalidArgument(args[i] + " applies to the sync algorithms (--sync " +
                                 sync::syncAlgorithms() + "), not --sync " + o.sync);
        }
      }
    }
  }
  // Checked here too (not only against the loaded data) so that a bad pair fails before the
  // dataset is read.
  if (o.limit > 0) {
    COFAB_RETURN_IF_ERROR(requireOneStepPerEpoch(o.limit, o.batch));
  }
  return o;
}

}  // namespace cofab::examples
