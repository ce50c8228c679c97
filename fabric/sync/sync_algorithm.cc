#include "fabric/sync/sync_algorithm.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/check.h"
#include "fabric/compress/codec.h"
#include "fabric/sync/algorithm_base.h"

namespace cofab::sync {
namespace detail {

AlgorithmBase::AlgorithmBase(std::string name, const SyncOptions& options, const SyncEnv& env,
                             int threads, bool backgroundThread)
    : name_(std::move(name)),
      options_(options),
      env_(env),
      threads_(threads),
      model_(threads > 1 || backgroundThread ? SharedModel::Access::kConcurrent
                                             : SharedModel::Access::kSingleThread) {}

Status AlgorithmBase::start(std::span<const float> initial,
                            const std::vector<size_t>& tensorCounts) {
  if (backgroundRunning()) {
    return FailedPrecondition("sync " + name_ + ": already started; finish() first");
  }
  startedOk_.store(false, std::memory_order_release);
  failed_ = OkStatus();
  Status s = doStart(initial, tensorCounts);
  startedOk_.store(s.ok(), std::memory_order_release);
  return s;
}

Status AlgorithmBase::setUp(std::span<const float> initial,
                            const std::vector<size_t>& tensorCounts) {
  size_t total = 0;
  offsets_.clear();
  counts_.clear();
  for (size_t c : tensorCounts) {
    if (c == 0) return InvalidArgument("sync " + name_ + ": a tensor of the layout is empty");
    if (c > initial.size() - total) {  // also what would wrap the sum around (and meet the size)
      return InvalidArgument("sync " + name_ + ": the tensor layout covers more than the model's " +
                             std::to_string(initial.size()) + " floats");
    }
    offsets_.push_back(total);
    counts_.push_back(c);
    total += c;
  }
  if (tensorCounts.empty() || total != initial.size()) {
    return InvalidArgument("sync " + name_ + ": the tensor layout covers " + std::to_string(total) +
                           " floats, the model has " + std::to_string(initial.size()));
  }
  total_ = total;
  model_.assign(initial);
  momentum_.clear();
  for (int t = 0; t < threads_; ++t) {
    momentum_.push_back(std::make_unique<Momentum>(total_, options_.momentum));
  }
  started_ = std::chrono::steady_clock::now();
  return OkStatus();
}

Status AlgorithmBase::readFinal(std::span<float> out) const {
  if (out.size() != total_) {
    return InvalidArgument("sync " + name_ + ": finish() was given room for " +
                           std::to_string(out.size()) + " floats, the model has " +
                           std::to_string(total_));
  }
  model_.read(out);
  return OkStatus();
}

void AlgorithmBase::read(int thread, std::span<float> out) {
  // The training loop's hot path, hence a checked precondition rather than a Status: a buffer
  // of another size than the model (or a read before start()) is a bug in the caller.
  COFAB_CHECK(thread >= 0 && thread < threads_) << "sync " << name_ << ": read() by thread "
                                                << thread << " of " << threads_;
  // startedOk(), not a layout: a start() that set the layout up and then failed (connecting)
  // left one, and read() quietly gave the initial or a previous run's model.
  COFAB_CHECK(startedOk()) << "sync " << name_ << ": read() before start() succeeded";
  COFAB_CHECK(out.size() == total_)
      << "sync " << name_ << ": read() into " << out.size() << " floats, the model has " << total_;
  model_.read(out);
}

Status AlgorithmBase::checkStep(int thread, std::span<const float> grad) const {
  if (thread < 0 || thread >= threads_) {
    return InvalidArgument("sync " + name_ + ": thread " + std::to_string(thread) +
                           " out of range (threads " + std::to_string(threads_) + ")");
  }
  if (!startedOk()) {
    return FailedPrecondition("sync " + name_ + ": start() not called or failed");
  }
  if (grad.size() != total_) {
    return InvalidArgument("sync " + name_ + ": gradient has " + std::to_string(grad.size()) +
                           " floats, the model " + std::to_string(total_));
  }
  return OkStatus();
}

void AlgorithmBase::localSgd(int thread, std::span<const float> grad) {
  model_.add(momentum_[size_t(thread)]->update(grad), -options_.lr);
}

float AlgorithmBase::alpha() const {
  return options_.elasticAlpha > 0 ? options_.elasticAlpha : 0.9f / float(env_.worldSize);
}

std::string AlgorithmBase::storeKey(const std::string& what) const {
  // Under the job's aggregator prefix: groups of one job with daemons of their own (their own
  // storePrefix) do not share a sample counter or finish barrier. They used to be
  // "cofab/sync/<name>/..." for every job on the store. (Not a per-run counter: ranks could
  // not agree on one across a sweep's different world sizes or a retried start().)
  return env_.client.storePrefix + "/sync/" + name_ + "/" + what;
}

Status AlgorithmBase::storeBarrier(const std::string& what) {
  if (env_.store == nullptr) return FailedPrecondition("sync " + name_ + ": no store");
  COFAB_RETURN_IF_ERROR(
      env_.store->set(storeKey(what + "/" + std::to_string(env_.rank)), Bytes{1}));
  std::vector<std::string> keys;
  for (int r = 0; r < env_.worldSize; ++r) keys.push_back(storeKey(what + "/" + std::to_string(r)));
  return env_.store->wait(keys, deadline())
      .withContext("sync " + name_ + ": waiting for every worker to reach '" + what + "'");
}

Status AlgorithmBase::publishSamples() {
  uint64_t n = unpublishedSamples_.exchange(0, std::memory_order_relaxed);
  StatusOr<int64_t> total = env_.store->add(storeKey("samples"), int64_t(n));
  if (!total.ok()) {
    // Not added: they go with the next publish (finish() makes one), so the job's count stays
    // exact if the store comes back.
    unpublishedSamples_.fetch_add(n, std::memory_order_relaxed);
    return total.status().withContext("sync " + name_ + ": publishing the job's sample count");
  }
  globalSamples_.store(uint64_t(*total - samplesBase_), std::memory_order_relaxed);
  return OkStatus();
}

StatusOr<std::unique_ptr<ps::PushPullClient>> connectPushPull(const SyncEnv& env) {
  if (env.store != nullptr) {
    return ps::PushPullClient::connect(*env.store, env.rank, env.worldSize, env.client);
  }
  return ps::PushPullClient::connect(env.rank, env.worldSize, env.client);
}

SyncStats AlgorithmBase::stats() const {
  SyncStats s;
  s.steps = steps_.load();
  s.syncs = syncs_.load();
  s.bytesSent = bytesSent_.load();
  s.bytesReceived = bytesReceived_.load();
  s.staleUpdates = staleUpdates_.load();
  s.maxStaleness = maxStaleness_.load();
  uint64_t applies = applies_.load();
  s.meanStaleness = applies ? double(stalenessSum_.load()) / double(applies) : 0.0;
  s.dropped = dropped_.load();
  s.droppedSamples = droppedSamples_.load();
  s.skipped = skipped_.load();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  s.syncsPerSecond = secs > 0 ? double(s.syncs) / secs : 0.0;
  s.stepsPerSync = s.syncs ? double(s.steps) / double(s.syncs) : 0.0;
  return s;
}

}  // namespace detail

std::string syncAlgorithms() {
  return "sync, ssp, shadowsync, easgd, eawild, gossip, int8, onebit, gradcode";
}

bool isSyncAlgorithm(const std::string& a) {
  return a == "sync" || a == "ssp" || a == "shadowsync" || a == "easgd" || a == "eawild" ||
         a == "gossip" || a == "int8" || a == "onebit" || a == "gradcode";
}

bool needsAggregators(const std::string& algorithm) { return algorithm != "gossip"; }

StatusOr<std::unique_ptr<SyncAlgorithm>> makeSyncAlgorithm(const SyncOptions& options,
                                                           const SyncEnv& env) {
  const std::string& a = options.algorithm;
  if (!isSyncAlgorithm(a)) {
    return InvalidArgument("sync algorithm '" + a + "' is not one of: " + syncAlgorithms());
  }
  if (env.worldSize < 1 || env.rank < 0 || env.rank >= env.worldSize) {
    return InvalidArgument("sync " + a + ": rank " + std::to_string(env.rank) + " of " +
                           std::to_string(env.worldSize));
  }
  // NaN passes every range check below (each comparison with it is false) and +inf passes lr's:
  // refuse values that are not finite first, naming the option.
  const std::pair<const char*, float> reals[] = {
      {"lr", options.lr}, {"momentum", options.momentum}, {"elasticAlpha", options.elasticAlpha}};
  for (const auto& [option, value] : reals) {
    if (!std::isfinite(value)) {
      return InvalidArgument("sync " + a + ": " + option + " must be a finite number, got " +
                             std::to_string(value));
    }
  }
  if (!(options.lr > 0) || options.momentum < 0 || options.momentum >= 1) {
    return InvalidArgument("sync " + a + ": lr must be > 0 and momentum in [0, 1)");
  }
  // Integer options with a floor, each refused naming itself and its value.
  const struct {
    const char* option;
    int64_t value, min;
    const char* note;
  } floors[] = {{"timeoutMs", options.timeoutMs, 1, ""},
                {"shadowIntervalMs", options.shadowIntervalMs, 0, " (0: back to back)"},
                {"syncEvery", options.syncEvery, 1, ""},
                {"threads", options.threads, 1, ""}};
  for (const auto& f : floors) {
    if (f.value < f.min) {
      return InvalidArgument("sync " + a + ": " + f.option + " must be >= " +
                             std::to_string(f.min) + f.note + ", got " + std::to_string(f.value));
    }
  }
  // Only eawild runs several training threads per worker; any other algorithm would train with
  // one while the caller thought it had asked for more.
  if (options.threads != 1 && a != "eawild") {
    return InvalidArgument("sync " + a + ": threads applies to eawild only (got " +
                           std::to_string(options.threads) + "; the others train with 1)");
  }
  if (!(options.elasticAlpha >= 0 && options.elasticAlpha < 1)) {
    return InvalidArgument("sync " + a + ": elasticAlpha must be in [0, 1), got " +
                           std::to_string(options.elasticAlpha));
  }
  if (options.replyFeedback && a != "onebit") {
    return InvalidArgument("sync " + a + ": replyFeedback applies to onebit only");
  }
  // Checked here, not by the first compressed push (step 0 failed on every worker, for good,
  // after start() had succeeded); and refused where nothing is compressed, not ignored.
  if (options.compressionBlock != 0 && a != "int8" && a != "onebit") {
    return InvalidArgument("sync " + a + ": compressionBlock applies to int8 and onebit only");
  }
  if (options.compressionBlock > compress::kMaxBlock) {
    return InvalidArgument(
        "sync " + a + ": compressionBlock must be in [1, " + std::to_string(compress::kMaxBlock) +
        "] (0: the codec's default), got " + std::to_string(options.compressionBlock));
  }
  if (a == "ssp" && options.stalenessUnit != "versions" && options.stalenessUnit != "clocks") {
    return InvalidArgument("sync ssp: stalenessUnit must be \"versions\" or \"clocks\", got \"" +
                           options.stalenessUnit + "\"");
  }
  if (needsAggregators(a) && env.store == nullptr && env.client.serverAddresses.empty()) {
    return InvalidArgument("sync " + a + " needs aggregators: a store or client.serverAddresses");
  }
  if (a == "sync" || a == "int8" || a == "onebit") return detail::makeBspSync(options, env);
  if (a == "shadowsync") return detail::makeShadowSync(options, env);
  if (a == "gossip") return detail::makeGossipSync(options, env);
  if (a == "ssp") return detail::makeSspSync(options, env);
  if (a == "easgd" || a == "eawild") return detail::makeElasticSync(options, env);
  if (a == "gradcode") return detail::makeGradcodeSync(options, env);
  return InvalidArgument("sync algorithm '" + a + "' is not one of: " + syncAlgorithms());
}

}  // namespace cofab::sync
