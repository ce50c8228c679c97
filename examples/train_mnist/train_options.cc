#include "examples/train_mnist/train_options.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/param.h"
#include "examples/train_mnist/gradient_sync.h"
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

namespace {

// One option's name and value, and the strict parsers both option parsers use.
struct OptionValue {
  const std::string& name;
  const std::string& value;
  // parseIntIn / parseDoubleIn with the option's range.
  StatusOr<int64_t> integer(int64_t min, int64_t max) const {
    return parseIntIn(value, name, min, max);
  }
  StatusOr<double> number(double min, double max) const {
    return parseDoubleIn(value, name, min, max);
  }
  StatusOr<bool> onOff() const {
    if (value == "on") return true;
    if (value == "off") return false;
    return InvalidArgument(name + " expects on or off, got '" + value + "'");
  }
};

// The options only the sync algorithms read (o.algo): true when `name` is one of them.
StatusOr<bool> parseAlgorithmOption(const OptionValue& ov, SyncTrainConfig& a) {
  const std::string& name = ov.name;
  const std::string& v = ov.value;
  if (name == "--threads") {
    COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(1, 256));
    a.threads = int(x);
  } else if (name == "--sync-every") {
    COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(0, 1000000));
    a.syncEvery = int(x);
  } else if (name == "--elastic-alpha") {
    COFAB_ASSIGN_OR_RETURN(double x, ov.number(0, 1));
    if (!(x < 1)) return InvalidArgument("--elastic-alpha must be below 1, got '" + v + "'");
    a.elasticAlpha = float(x);
  } else if (name == "--shadow-interval-ms") {
    COFAB_ASSIGN_OR_RETURN(a.shadowIntervalMs, ov.integer(0, 3600000));
  } else if (name == "--compression-block") {
    COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(0, 1 << 30));
    a.compressionBlock = size_t(x);
  } else if (name == "--slow-rank") {
    COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(-1, 1 << 20));
    a.slowRank = int(x);
  } else if (name == "--slow-factor") {
    COFAB_ASSIGN_OR_RETURN(a.slowFactor, ov.number(1, 1000));
  } else if (name == "--device-ms") {
    COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(0, 60000));
    a.deviceMs = int(x);
  } else if (name == "--gradient-stragglers") {
    COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(0, 65535));
    a.gradientStragglers = int(x);
  } else if (name == "--gradcode-window") {
    COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(1, 1 << 20));
    a.gradcodeWindow = int(x);
  } else if (name == "--gossip-peers") {
    a.gossipPeers = v;
  } else if (name == "--shadow-mode") {
    a.shadowMode = v;
  } else if (name == "--reply-feedback") {
    COFAB_ASSIGN_OR_RETURN(a.replyFeedback, ov.onOff());
  } else if (name == "--nesterov") {
    COFAB_ASSIGN_OR_RETURN(a.onebitNesterov, ov.onOff());
  } else if (name == "--staleness-unit") {
    a.stalenessUnit = v;
  } else {
    return false;
  }
  return true;
}

}  // namespace

StatusOr<TrainOptions> parseTrainOptions(const std::vector<std::string>& args) {
  TrainOptions o;
  SyncTrainConfig& a = o.algo;
  std::string firstAlgorithmOption;
  for (size_t i = 0; i < args.size(); i += 2) {
    const std::string& name = args[i];
    if (i + 1 >= args.size()) return InvalidArgument(name + " needs a value");
    const std::string& v = args[i + 1];
    if (v.empty()) return InvalidArgument(name + " needs a value, got ''");
    const OptionValue ov{name, v};
    if (name == "--epochs") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(1, 1000000));
      o.epochs = int(x);
    } else if (name == "--batch") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(1, 1 << 20));
      o.batch = int(x);
    } else if (name == "--hidden") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(1, 1 << 16));
      o.hidden = int(x);
    } else if (name == "--lr") {
      COFAB_ASSIGN_OR_RETURN(double x, ov.number(0, 1000));
      if (!(x > 0)) return InvalidArgument("--lr must be > 0, got '" + v + "'");
      o.lr = float(x);
    } else if (name == "--momentum") {
      COFAB_ASSIGN_OR_RETURN(double x, ov.number(0, 1));
      if (!(x < 1)) return InvalidArgument("--momentum must be below 1, got '" + v + "'");
      o.momentum = float(x);
    } else if (name == "--seed") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(0, std::numeric_limits<int64_t>::max()));
      o.seed = uint64_t(x);
    } else if (name == "--limit") {
      COFAB_ASSIGN_OR_RETURN(int64_t x, ov.integer(0, 1000000000));
      o.limit = size_t(x);
    } else if (name == "--data-dir") {
      o.dataDir = v;
    } else if (name == "--sync") {
      o.sync = v;
    } else {
      COFAB_ASSIGN_OR_RETURN(bool algorithmOnly, parseAlgorithmOption(ov, a));
      if (!algorithmOnly) return InvalidArgument("unknown option " + name);
      if (firstAlgorithmOption.empty()) firstAlgorithmOption = name;
    }
  }
  if (!isGradientSyncMode(o.sync) && !sync::isSyncAlgorithm(o.sync)) {
    return InvalidArgument("--sync '" + o.sync + "' is not one of: " + syncModes());
  }
  // The options of the sync algorithms (o.algo) mean nothing to the gradient paths (--sync local,
  // aggregator, ...): they were parsed and dropped, and `--sync aggregator --slow-rank 1` ran
  // with no slow rank.
  if (!firstAlgorithmOption.empty() && !sync::isSyncAlgorithm(o.sync)) {
    return InvalidArgument(firstAlgorithmOption + " applies to the sync algorithms (--sync " +
                           sync::syncAlgorithms() + "), not --sync " + o.sync);
  }
  // Checked here too (not only against the loaded data) so that a bad pair fails before the
  // dataset is read.
  if (o.limit > 0) {
    COFAB_RETURN_IF_ERROR(requireOneStepPerEpoch(o.limit, o.batch));
  }
  return o;
}

}  // namespace cofab::examples
